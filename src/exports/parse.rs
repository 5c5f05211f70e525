//! exports(5) file parser.
//!
//! ```text
//! # comment
//! /srv/share   192.168.0.0/24(rw,no_root_squash) *.lab(ro) 10.0.0.5
//! "/srv/with space" -rw,async  host1 host2(ro)
//! ```
//! Lines may continue with a trailing backslash. Options after a `-` are the defaults for
//! the clients after them on that line.

use super::{export_id_for_path, ClientRule, ClientSpec, Export, ExportOptions, ExportTable};
use crate::vfs::INVALID_ID;
use std::net::{IpAddr, ToSocketAddrs};
use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("{file}:{line}: {message}")]
pub struct ExportsError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

/// Parses exports text. `file` is used in error messages. Host names are resolved with
/// the system resolver.
pub fn parse_exports(text: &str, file: &str) -> Result<ExportTable, ExportsError> {
    parse_exports_with(text, file, &resolve_host)
}

/// The addresses a host name of a rule stands for, from the system resolver.
fn resolve_host(name: &str) -> Vec<IpAddr> {
    (name, 0).to_socket_addrs().map(|a| a.map(|sa| sa.ip()).collect()).unwrap_or_default()
}

/// [`parse_exports`] with the host names of rules resolved by `resolve` (the fuzz target
/// parses without asking any resolver).
pub fn parse_exports_with(text: &str, file: &str, resolve: &dyn Fn(&str) -> Vec<IpAddr>) -> Result<ExportTable, ExportsError> {
    let mut table = ExportTable::default();
    // The `fsid=` each export's lines gave, if any (its id otherwise comes from the path).
    let mut explicit_fsids: Vec<Option<u32>> = Vec::new();
    let mut logical = String::new();
    let mut start_line = 0;
    for (i, raw) in text.lines().enumerate() {
        if logical.is_empty() {
            start_line = i + 1;
        }
        let line = strip_comment(raw);
        if let Some(cont) = line.strip_suffix('\\') {
            logical.push_str(cont);
            logical.push(' ');
            continue;
        }
        logical.push_str(line);
        let err = |message: String| ExportsError { file: file.to_string(), line: start_line, message };
        if !logical.trim().is_empty() {
            let (mut export, fsid) = parse_line(&logical, resolve).map_err(err)?;
            for rule in &mut export.rules {
                rule.line = start_line;
            }
            let i = match table.exports.iter().position(|e| e.path == export.path) {
                Some(i) => {
                    merge_line(&mut table.exports[i], &mut explicit_fsids[i], export, fsid).map_err(err)?;
                    i
                }
                None => {
                    table.exports.push(export);
                    explicit_fsids.push(fsid);
                    table.exports.len() - 1
                }
            };
            let this = &table.exports[i];
            if let Some(other) = table.exports.iter().find(|e| e.id == this.id && e.path != this.path) {
                return Err(err(format!("fsid {} is already used by {}", this.id, other.path.display())));
            }
        }
        logical.clear();
    }
    if !logical.trim().is_empty() {
        return Err(ExportsError { file: file.to_string(), line: start_line, message: "line continues past end of file".into() });
    }
    Ok(table)
}

/// A second line for an exported path adds its clients after the first line's, as
/// exportfs does (it keeps an entry per client and path). The lines must agree on what
/// belongs to the export as a whole: its `fsid` and `mountpoint`.
fn merge_line(into: &mut Export, into_fsid: &mut Option<u32>, line: Export, fsid: Option<u32>) -> Result<(), String> {
    let path = into.path.display();
    if let Some(f) = fsid {
        if into_fsid.is_some_and(|g| g != f) {
            return Err(format!("{path} is given fsid {f} here and {} on an earlier line", into.id));
        }
        // An fsid on a later line is the export's, as if it had been on the first.
        into.id = f;
        *into_fsid = Some(f);
    }
    if line.needs_mount.is_some() && into.needs_mount.is_some() && line.needs_mount != into.needs_mount {
        return Err(format!("{path} needs a different mountpoint here than on an earlier line"));
    }
    into.needs_mount = into.needs_mount.take().or(line.needs_mount);
    for rule in line.rules {
        if into.rules.iter().any(|r| r.spec == rule.spec) {
            tracing::warn!(export = %path, client = ?rule.spec, "the client is listed for this path on another line too: the rule on the earlier line applies");
        }
        into.rules.push(rule);
    }
    Ok(())
}

/// Exports whose paths turned out to name one directory (a symlink on the way) are one
/// export, as lines naming one path are: clients in file order, and they must agree on
/// `fsid` and `mountpoint`. Run once the paths are canonical. Without an `fsid=`, the
/// export keeps the id of the line that wrote its canonical path, if one did (adding
/// or removing another name for it then leaves its clients' handles valid), else of
/// the first line.
pub fn merge_same_directories(table: &mut ExportTable) -> Result<(), String> {
    struct Merged {
        export: Export,
        fsid: Option<u32>,
        /// Its id is the one its canonical path gives.
        canonical_id: bool,
    }
    let mut merged: Vec<Merged> = Vec::new();
    for e in std::mem::take(&mut table.exports) {
        let canonical = e.written_paths.is_empty();
        let written = e.written_paths.first().unwrap_or(&e.path).clone();
        let fsid = (e.id != export_id_for_path(&written)).then_some(e.id);
        match merged.iter_mut().find(|m| m.export.path == e.path) {
            Some(m) => {
                let first = m.export.written_paths.first().unwrap_or(&m.export.path).display().to_string();
                let (id, names) = (e.id, e.written_paths.clone());
                merge_line(&mut m.export, &mut m.fsid, e, fsid)
                    .map_err(|why| format!("{first} and {} are one directory, so one export: {why}", written.display()))?;
                if m.fsid.is_none() && canonical && !m.canonical_id {
                    m.export.id = id;
                    m.canonical_id = true;
                }
                for name in names {
                    if !m.export.written_paths.contains(&name) {
                        m.export.written_paths.push(name);
                    }
                }
                if m.fsid.is_none() {
                    tracing::warn!(
                        export = %m.export.path.display(), names = ?m.export.written_paths,
                        "several names of one directory are exported: served as one export; give it fsid= so that its id does not depend on which names the file lists"
                    );
                }
            }
            None => merged.push(Merged { fsid, canonical_id: canonical, export: e }),
        }
    }
    // Each export's rules came together name by name; the first rule of a kind that
    // matches a client wins, so they go back in the order the file gave them (stable:
    // one line's rules keep theirs).
    table.exports = merged
        .into_iter()
        .map(|mut m| {
            m.export.rules.sort_by_key(|r| r.line);
            m.export
        })
        .collect();
    Ok(())
}

fn strip_comment(line: &str) -> &str {
    let mut in_quotes = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => in_quotes = !in_quotes,
            '#' if !in_quotes => return line[..i].trim_end(),
            _ => {}
        }
    }
    line.trim_end()
}

/// Splits on whitespace outside quotes and parentheses.
fn tokens(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let (mut quoted, mut depth) = (false, 0);
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            '(' if !quoted => {
                depth += 1;
                cur.push(c)
            }
            ')' if !quoted => {
                depth -= 1;
                cur.push(c)
            }
            c if c.is_whitespace() && !quoted && depth == 0 => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if quoted {
        return Err("unterminated quote".into());
    }
    if depth != 0 {
        return Err("unbalanced parentheses".into());
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    Ok(out)
}

/// Decodes `\NNN` octal escapes (exportfs writes spaces as `\040`).
fn unescape_path(p: &str) -> Result<String, String> {
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            out.push(u8::try_from(v).map_err(|_| format!("bad escape in {p}"))?);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("path {p} is not valid UTF-8"))
}

/// One export line, and the `fsid=` it gave if any.
fn parse_line(line: &str, resolve: &dyn Fn(&str) -> Vec<IpAddr>) -> Result<(Export, Option<u32>), String> {
    let toks = tokens(line)?;
    let mut it = toks.into_iter().peekable();
    let path = unescape_path(&it.next().ok_or("missing export path")?)?;
    if !path.starts_with('/') {
        return Err(format!("export path {path:?} is not absolute"));
    }
    let mut defaults = ExportOptions::default();
    let mut export_opts = PerExport::default();
    let mut rules = Vec::new();
    let mut unused_defaults = false;
    for tok in it {
        // `-opts`: defaults for the clients after it on the line.
        if let Some(d) = tok.strip_prefix('-') {
            apply_options(&mut defaults, d, &mut export_opts)?;
            unused_defaults = true;
            continue;
        }
        unused_defaults = false;
        let (client, opts) = match tok.find('(') {
            Some(p) => {
                let inner = tok[p + 1..].strip_suffix(')').ok_or_else(|| format!("bad client entry {tok:?}"))?;
                (&tok[..p], Some(inner))
            }
            None => (tok.as_str(), None),
        };
        if client.is_empty() {
            // `host (rw)`: the space makes `(rw)` a rule for everyone, as in exportfs,
            // which warns about it too.
            tracing::warn!(export = %path, options = ?opts, "options with no client before them apply to every client: write *(...) if that is meant, or remove the space after the host");
        }
        let mut options = defaults.clone();
        if let Some(o) = opts {
            apply_options(&mut options, o, &mut export_opts)?;
        }
        rules.push(ClientRule { spec: parse_client(client, resolve)?, options, line: 0 });
    }
    if unused_defaults && !rules.is_empty() {
        tracing::warn!(export = %path, "options after the last client apply to no one: put them before the clients they are for");
    }
    if rules.is_empty() {
        // exportfs: an export with no client list is open to everyone.
        rules.push(ClientRule { spec: ClientSpec::Anyone, options: defaults, line: 0 });
    }
    // Normalised (`//`, a trailing `/`, `.` dropped) before the id is derived from it, so
    // that rewriting the line that way leaves every client's handles valid.
    let path: PathBuf = PathBuf::from(path).components().collect();
    let needs_mount = export_opts.mountpoint.map(|m| m.map_or_else(|| path.clone(), PathBuf::from));
    let id = export_opts.fsid.unwrap_or_else(|| export_id_for_path(&path));
    Ok((Export { id, path, rules, needs_mount, written_paths: Vec::new() }, export_opts.fsid))
}

/// An anonymous uid or gid (`anonuid=`, `--anonuid`): 4294967295, or -1, names no one,
/// and calls squashed to it would keep the server's own identity.
pub fn parse_anon_id(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(INVALID_ID) => Err(format!("{s}: 4294967295 (-1) is no one's id")),
        Ok(id) => Ok(id),
        Err(_) if s.trim() == "-1" => Err(format!("{s}: 4294967295 (-1) is no one's id")),
        Err(_) => Err(format!("{s}: not a number from 0 to 4294967294")),
    }
}

/// `fsid=`: `root`, a number as `strtoul(…, 0)` reads it (`0x` hex, a leading `0` octal,
/// as nfs-utils does, so that two spellings of one fsid are one), or a UUID (32 hex
/// digits, `-` or `:` between them allowed), as exportfs takes them.
fn parse_fsid(value: &str) -> Result<u32, String> {
    let number = if value == "root" {
        Some(0)
    } else if let Some(hex) = value.strip_prefix("0x").or_else(|| value.strip_prefix("0X")) {
        u32::from_str_radix(hex, 16).ok()
    } else if value.len() > 1 && value.starts_with('0') {
        u32::from_str_radix(&value[1..], 8).ok()
    } else {
        value.parse::<u32>().ok()
    };
    if let Some(n) = number.filter(|_| value.chars().all(|c| c.is_ascii_alphanumeric())) {
        return Ok(n);
    }
    let digits: String = value.chars().filter(|c| !matches!(c, '-' | ':')).collect();
    if digits.len() == 32 && digits.chars().all(|c| c.is_ascii_hexdigit()) {
        let uuid = u128::from_str_radix(&digits, 16).expect("32 hex digits");
        return Ok(export_id_for_uuid(uuid));
    }
    Err(format!("fsid={value}: neither root, a number from 0 to 4294967295, nor a UUID (32 hex digits)"))
}

/// The id in file handles of an export named by a UUID. Handles carry 32 bits; ids
/// derived from paths are odd, these even and never 0 (`root`), so the two kinds never
/// meet, and a clash with a numeric `fsid=` is refused like any other.
fn export_id_for_uuid(uuid: u128) -> u32 {
    let h = blake3::hash(&uuid.to_be_bytes());
    let id = u32::from_le_bytes(h.as_bytes()[..4].try_into().expect("4 bytes")) & !1;
    if id == 0 {
        2
    } else {
        id
    }
}

/// Options that belong to the export rather than to one client.
#[derive(Default)]
struct PerExport {
    fsid: Option<u32>,
    /// `mountpoint`/`mp`, with its path if one was given.
    mountpoint: Option<Option<String>>,
}

/// One client as exports(5) writes it (address, network, host name, wildcard or `*`),
/// host names resolved with the system resolver.
pub fn parse_client_spec(s: &str) -> Result<ClientSpec, String> {
    parse_client(s, &resolve_host)
}

fn parse_client(s: &str, resolve: &dyn Fn(&str) -> Vec<IpAddr>) -> Result<ClientSpec, String> {
    if s.is_empty() || s == "*" {
        return Ok(ClientSpec::Anyone);
    }
    if s.starts_with('@') {
        return Err(format!("netgroups are not supported: {s}"));
    }
    if let Some((net, mask)) = s.split_once('/') {
        let ip: IpAddr = net.parse().map_err(|_| format!("bad network address {net:?}"))?;
        let prefix = match mask.parse::<u8>() {
            Ok(p) => p,
            Err(_) => {
                let m: std::net::Ipv4Addr = mask.parse().map_err(|_| format!("bad netmask {mask:?}"))?;
                let bits = u32::from(m);
                if bits.leading_ones() + bits.trailing_zeros() != 32 {
                    return Err(format!("netmask {mask} is not contiguous"));
                }
                bits.leading_ones() as u8
            }
        };
        let max = if ip.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(format!("prefix /{prefix} too long for {net}"));
        }
        return Ok(ClientSpec::Network(ip, prefix));
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(ClientSpec::Address(ip));
    }
    if s.starts_with('[') && s.contains(':') {
        return Err(format!("{s}: write IPv6 addresses without brackets (e.g. ::1 or fd00::/8)"));
    }
    if s.contains(['*', '?', '[']) {
        return Ok(ClientSpec::Wildcard(s.to_string()));
    }
    if looks_like_an_old_style_address(s) {
        // The resolver would read these as inet_aton does: `10.1` as 10.0.0.1,
        // `192.168.010.5` (octal) as 192.168.8.5, so the rule would admit another machine.
        return Err(format!(
            "{s:?} is not an address in dotted-decimal form (a.b.c.d, no leading zeros): write the address meant that way"
        ));
    }
    if !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_') {
        return Err(format!("bad client name {s:?}"));
    }
    let addrs = resolve(s);
    if addrs.is_empty() {
        tracing::warn!(host = s, "the host name resolves to no address: its rule admits no one");
    }
    Ok(ClientSpec::Host(s.to_string(), addrs))
}

/// Whether a client entry is made of numbers only (decimal, octal with a leading zero,
/// or `0x` hexadecimal) separated by dots: no host name is, and the resolver takes it
/// for an address in one of inet_aton's old forms.
fn looks_like_an_old_style_address(s: &str) -> bool {
    s.split('.').all(|label| {
        let hex = label.strip_prefix("0x").or_else(|| label.strip_prefix("0X"));
        match hex {
            Some(digits) => digits.bytes().all(|b| b.is_ascii_hexdigit()),
            None => !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit()),
        }
    })
}

fn apply_options(o: &mut ExportOptions, list: &str, export: &mut PerExport) -> Result<(), String> {
    for opt in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let anon_id = |v: Option<&str>| -> Result<u32, String> {
            parse_anon_id(v.ok_or_else(|| format!("{key} needs a value"))?).map_err(|e| format!("{key}={e}"))
        };
        // Only these take a value, as in nfs-utils: `rw=host` (another system's syntax for
        // a host list) must not quietly mean `rw` for everyone.
        if value.is_some() && !matches!(key, "anonuid" | "anongid" | "fsid" | "sec" | "mountpoint" | "mp") {
            return Err(format!("export option {opt:?}: {key} takes no value"));
        }
        match key {
            "rw" => o.read_only = false,
            "ro" => o.read_only = true,
            "sync" => o.sync = true,
            "async" => o.sync = false,
            "root_squash" => o.root_squash = true,
            "no_root_squash" => o.root_squash = false,
            "all_squash" => o.all_squash = true,
            "no_all_squash" => o.all_squash = false,
            "anonuid" => o.anonuid = anon_id(value)?,
            "anongid" => o.anongid = anon_id(value)?,
            "secure" => o.secure = true,
            "insecure" => o.secure = false,
            "fsid" => export.fsid = Some(parse_fsid(value.ok_or("fsid needs a value")?)?),
            "mountpoint" | "mp" => match value {
                Some(p) if !p.starts_with('/') => return Err(format!("{opt}: the path must be absolute")),
                _ => export.mountpoint = Some(value.map(str::to_string)),
            },
            "sec" => {
                // exportfs takes a colon-separated list of flavours; nasd speaks AUTH_SYS only.
                let flavours = value.unwrap_or("");
                if !flavours.split(':').any(|f| f == "sys") {
                    return Err(format!(
                        "sec={flavours}: nasd authenticates with sec=sys only (Kerberos and the other flavours are not supported)"
                    ));
                }
                if flavours != "sys" {
                    tracing::warn!(
                        sec = flavours,
                        "only sys of these security flavours is offered; clients asking for another cannot mount"
                    );
                }
            }
            "subtree_check" => {
                // knfsd's check that a file's handle still leads to it from the export is
                // not made: a file moved or linked out of the export stays reachable
                // through the handle a client holds (directories are checked, always).
                tracing::warn!("subtree_check is not enforced: served as no_subtree_check, knfsd's default");
            }
            // Accepted for compatibility; they do not change behaviour here.
            "no_subtree_check" | "wdelay" | "no_wdelay" | "hide" | "nohide" | "crossmnt" | "no_acl" | "acl" | "secure_locks"
            | "insecure_locks" | "auth_nlm" | "no_auth_nlm" => {}
            _ => return Err(format!("unknown export option {opt:?}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn parses_typical_file() {
        let text = r#"
# comment line
/srv/a   127.0.0.1(rw,no_root_squash,insecure) 10.0.0.0/255.0.0.0(ro) *.lab(rw,all_squash,anonuid=1000,anongid=100)
"/srv/with space" -rw,async \
    *(insecure)   # trailing comment
/srv/c
/srv/d\040e localhost(rw)
"#;
        let t = parse_exports(text, "exports").unwrap();
        assert_eq!(t.exports.len(), 4);
        let a = &t.exports[0];
        assert_eq!(a.rules.len(), 3);
        assert_eq!(a.rules[0].spec, ClientSpec::Address("127.0.0.1".parse().unwrap()));
        assert!(!a.rules[0].options.read_only && !a.rules[0].options.secure);
        assert!(!a.rules[0].options.root_squash && !a.rules[0].options.all_squash);
        assert_eq!(a.rules[1].spec, ClientSpec::Network("10.0.0.0".parse().unwrap(), 8));
        assert!(a.rules[1].options.read_only);
        assert!(a.rules[2].options.all_squash);
        assert_eq!((a.rules[2].options.anonuid, a.rules[2].options.anongid), (1000, 100));
        let b = &t.exports[1];
        assert_eq!(b.path, PathBuf::from("/srv/with space"));
        assert!(!b.rules[0].options.read_only && !b.rules[0].options.sync && !b.rules[0].options.secure);
        let c = &t.exports[2];
        assert_eq!(c.rules[0].spec, ClientSpec::Anyone);
        assert_eq!(c.rules[0].options, ExportOptions::default());
        assert_eq!(t.exports[3].path, PathBuf::from("/srv/d e"));
        assert!(matches!(t.exports[3].rules[0].spec, ClientSpec::Host(ref h, _) if h == "localhost"));
        assert!(parse_exports("/a fsid=7", "ex").unwrap_err().message.contains("bad client name"));
        assert!(parse_exports("/a [::1](rw)", "ex").unwrap_err().message.contains("without brackets"));
        let classes = parse_exports("/a node[0-9].lab(rw)", "ex").unwrap();
        assert_eq!(classes.exports[0].rules[0].spec, ClientSpec::Wildcard("node[0-9].lab".into()));
    }

    #[test]
    fn errors_name_file_and_line() {
        let e = parse_exports("/ok *(rw)\n\n/bad *(rw,frobnicate)\n", "ex").unwrap_err();
        assert_eq!((e.file.as_str(), e.line), ("ex", 3));
        assert!(e.message.contains("frobnicate"), "{e}");
        assert_eq!(parse_exports("relative *(rw)", "ex").unwrap_err().line, 1);
        assert!(parse_exports("/a 10.0.0.0/33(rw)", "ex").is_err());
        assert!(parse_exports("/a *(anonuid=x)", "ex").is_err());
        assert!(parse_exports("/a @group(rw)", "ex").is_err());
        assert!(parse_exports("/a *(rw\n", "ex").is_err());
        let krb = parse_exports("/a *(sec=krb5)", "ex").unwrap_err();
        assert_eq!(krb.line, 1);
        assert!(krb.message.contains("sec=sys only"), "{krb}");
        assert!(parse_exports("/a *(sec=krb5p:sys)", "ex").is_ok(), "a list that holds sys serves sys");
    }

    #[test]
    fn addresses_the_resolver_would_read_as_another_machine_are_refused() {
        // inet_aton reads these as 10.0.0.1, 192.168.8.5 (octal), 10.0.0.1 and 0.0.4.210.
        for entry in ["10.1", "192.168.010.5", "0x0a.0.0.1", "1234"] {
            let e = parse_exports(&format!("/a {entry}(rw)"), "ex").unwrap_err();
            assert!(e.message.contains("dotted-decimal"), "{entry}: {e}");
        }
        let fine = parse_exports("/a 192.168.10.5(rw) 10.0.0.0/8(rw) 10.1.*(rw) h1.lab(rw)", "ex").expect("parses");
        assert_eq!(fine.exports[0].rules[0].spec, ClientSpec::Address("192.168.10.5".parse().unwrap()));
    }

    #[test]
    fn rewriting_an_export_path_with_extra_slashes_keeps_its_id() {
        let id = |line: &str| parse_exports(line, "ex").unwrap().exports[0].id;
        assert_eq!(id("/srv/data *(rw)"), id("/srv//data/ *(rw)"));
        assert_eq!(id("/srv/data *(rw)"), id("/srv/./data *(rw)"));
        assert_eq!(id("/srv/data *(rw)"), export_id_for_path(std::path::Path::new("/srv/data")), "ids of plain paths unchanged");
        assert_ne!(id("/srv/data *(rw)"), id("/srv/data2 *(rw)"));
    }

    #[test]
    fn squash_options_are_independent_and_flags_take_no_value() {
        let o = |line: &str| parse_exports(line, "ex").map(|t| t.exports[0].rules[0].options.clone());
        let both = o("/a *(rw,all_squash,no_root_squash)").unwrap();
        assert!(both.all_squash && !both.root_squash, "all_squash stays whatever root_squash says");
        let dash = o("/a -all_squash *(no_root_squash)").unwrap();
        assert!(dash.all_squash && !dash.root_squash);
        assert!(!o("/a *(all_squash,no_all_squash)").unwrap().all_squash);
        for bad in ["/a *(ro,rw=@trusted)", "/a *(no_root_squash=1)", "/a *(insecure=yes)", "/a *(root_nosquash)"] {
            assert!(o(bad).is_err(), "{bad}");
        }
        for bad in ["/a *(anonuid=-1)", "/a *(anongid=4294967295)"] {
            let e = o(bad).unwrap_err();
            assert!(e.message.contains("no one's id"), "{bad}: {e}");
        }
        let e = o("/a *(anonuid=-5)").unwrap_err();
        assert!(e.message.contains("anonuid") && e.message.contains("-5"), "a negative id other than -1: {e}");
        assert_eq!(o("/a *(anonuid=4294967294)").unwrap().anonuid, 4294967294);
    }

    #[test]
    fn dash_options_apply_to_the_clients_after_them() {
        let t = parse_exports("/a -rw 10.0.0.1 -no_root_squash 10.0.0.2 10.0.0.3(ro)", "ex").unwrap();
        let r = &t.exports[0].rules;
        assert_eq!(r.len(), 3, "a dash group is not a client: {r:?}");
        assert!(!r[0].options.read_only && r[0].options.root_squash);
        assert!(!r[1].options.read_only && !r[1].options.root_squash);
        assert!(r[2].options.read_only && !r[2].options.root_squash);
        // a space before the parenthesis: the options are everyone's (exportfs does the same)
        let t = parse_exports("/a 10.0.0.5 (rw)", "ex").unwrap();
        assert_eq!(t.exports[0].rules[1].spec, ClientSpec::Anyone);
        assert!(!t.exports[0].rules[1].options.read_only && t.exports[0].rules[0].options.read_only);
    }

    #[test]
    fn mountpoint_names_the_directory_that_must_be_mounted() {
        let m = |line: &str| parse_exports(line, "ex").map(|t| t.exports[0].needs_mount.clone());
        assert_eq!(m("/srv/a *(rw)").unwrap(), None);
        assert_eq!(m("/srv/a *(rw,mp)").unwrap(), Some(PathBuf::from("/srv/a")));
        assert_eq!(m("/srv/a -mountpoint=/srv *(rw)").unwrap(), Some(PathBuf::from("/srv")));
        assert!(m("/srv/a *(mp=srv)").is_err());
    }

    #[test]
    fn fsid_sets_export_id() {
        let t = parse_exports("/a *(rw,fsid=42)", "ex").unwrap();
        assert_eq!(t.exports[0].id, 42);
    }

    #[test]
    fn fsid_is_read_as_exportfs_reads_it() {
        let id = |o: &str| parse_exports(&format!("/a *({o})"), "ex").map(|t| t.exports[0].id);
        assert_eq!(id("fsid=root").unwrap(), 0);
        assert_eq!(id("fsid=0").unwrap(), 0);
        assert_eq!(id("fsid=4294967295").unwrap(), u32::MAX);
        assert_eq!(id("fsid=0x1f").unwrap(), 31, "strtoul base 0: hex");
        assert_eq!(id("fsid=010").unwrap(), 8, "strtoul base 0: octal");
        let uuid = id("fsid=5a6f1c2e-93b1-4f0e-8d4c-0123456789ab").unwrap();
        assert_eq!(id("fsid=5A6F1C2E93B14F0E8D4C0123456789AB").unwrap(), uuid, "case and dashes do not matter");
        assert_eq!(id("fsid=5a6f1c2e:93b14f0e:8d4c0123:456789ab").unwrap(), uuid, "nor colons");
        assert_ne!(id("fsid=5a6f1c2e-93b1-4f0e-8d4c-0123456789ac").unwrap(), uuid);
        assert!(uuid != 0 && uuid % 2 == 0, "never root, never a path-derived (odd) id");
        assert_eq!(export_id_for_uuid(0) % 2, 0);
        for bad in [
            "fsid=",
            "fsid=-1",
            "fsid=4294967296",
            "fsid=08",
            "fsid=0x",
            "fsid=12ab",
            "fsid=5a6f1c2e-93b1-4f0e-8d4c-0123456789",
            "fsid=5a6f1c2e 93b1",
        ] {
            assert!(id(bad).is_err(), "{bad}");
        }
        assert!(id("fsid").is_err());
        let e = parse_exports("/a *(fsid=5a6f1c2e-93b1-4f0e-8d4c-0123456789ab)\n/b *(fsid=5a6f1c2e93b14f0e8d4c0123456789ab)\n", "ex")
            .unwrap_err();
        assert!(e.message.contains("already used by /a"), "one UUID, two exports: {e}");
    }

    #[test]
    fn lines_for_one_path_add_their_clients_in_order() {
        let t = parse_exports("/a 10.0.0.0/8(rw) *(ro)\n/b *(rw)\n/a/ 192.168.1.0/24(rw,no_root_squash)\n", "ex").unwrap();
        assert_eq!(t.exports.len(), 2, "one export per path");
        let specs: Vec<_> = t.exports[0].rules.iter().map(|r| r.spec.clone()).collect();
        assert_eq!(
            specs,
            [
                ClientSpec::Network("10.0.0.0".parse().unwrap(), 8),
                ClientSpec::Anyone,
                ClientSpec::Network("192.168.1.0".parse().unwrap(), 24)
            ]
        );
        assert!(!t.exports[0].rules[2].options.root_squash);
        // the same client again: kept in order, so the earlier rule is the one that matches
        let t = parse_exports("/a *(rw)\n/a *(ro)\n", "ex").unwrap();
        assert!(!t.exports[0].rules[0].options.read_only);
    }

    #[test]
    fn exports_that_name_one_directory_are_one_export() {
        // As the reader leaves them once paths are canonical: /x/l1 and /x/l2 lead to /x/real.
        let canonical = |text: &str| {
            let mut t = parse_exports(text, "ex").unwrap();
            for e in &mut t.exports {
                if e.path != Path::new("/x/real") && e.path.starts_with("/x") {
                    e.written_paths = vec![std::mem::replace(&mut e.path, "/x/real".into())];
                }
            }
            t
        };
        let mut t = canonical("/x/l1 *(rw)\n/y 10.0.0.1(rw)\n/x/real 10.0.0.0/8(ro)\n/x/l2 10.0.0.0/8(rw) 10.0.0.2(rw)\n");
        merge_same_directories(&mut t).unwrap();
        assert_eq!(t.exports.len(), 2);
        let x = &t.exports[0];
        assert_eq!(x.id, export_id_for_path(Path::new("/x/real")), "the id its canonical path's line gave it");
        let specs: Vec<String> = x.rules.iter().map(|r| r.spec.to_string()).collect();
        assert_eq!(specs, ["*", "10.0.0.0/8", "10.0.0.0/8", "10.0.0.2"], "clients in file order");
        assert!(x.rules[1].options.read_only, "the earlier rule for a client is the one that applies");
        assert_eq!(x.written_paths, [PathBuf::from("/x/l1"), PathBuf::from("/x/l2")]);
        assert_eq!(t.exports[1].path, PathBuf::from("/y"));
        // an fsid on any of them is the export's; two different ones cannot both be
        let mut t = canonical("/x/l1 *(rw)\n/x/real 10.0.0.0/8(ro,fsid=5)\n");
        merge_same_directories(&mut t).unwrap();
        assert_eq!(t.exports[0].id, 5);
        // names that alternate: still file order, so the earlier line's rule applies
        let mut t = canonical("/x/l1 192.168.0.0/16(rw)\n/x/real 10.1.0.0/16(ro)\n/x/l1 10.1.2.0/24(rw,no_root_squash)\n");
        merge_same_directories(&mut t).unwrap();
        let specs: Vec<String> = t.exports[0].rules.iter().map(|r| r.spec.to_string()).collect();
        assert_eq!(specs, ["192.168.0.0/16", "10.1.0.0/16", "10.1.2.0/24"], "clients in file order");
        let client = "10.1.2.3".parse().unwrap();
        let options = t.exports[0].options_for(client, false).unwrap().expect("a rule matches");
        assert!(options.read_only && options.root_squash, "line 2 applies: {options:?}");
        let mut t = canonical("/x/l1 *(rw,fsid=4)\n/x/real 10.0.0.0/8(ro,fsid=5)\n");
        let e = merge_same_directories(&mut t).unwrap_err();
        assert!(e.contains("/x/l1 and /x/real are one directory") && e.contains("fsid 5"), "{e}");
        let mut t = canonical("/x/l1 *(mp=/x)\n/x/l2 *(mp=/y)\n");
        assert!(merge_same_directories(&mut t).is_err());
        // without the canonical path among them, the first name's id
        let mut t = canonical("/x/l2 *(rw)\n/x/l1 10.0.0.1(rw)\n");
        merge_same_directories(&mut t).unwrap();
        assert_eq!(t.exports[0].id, export_id_for_path(Path::new("/x/l2")));
    }

    #[test]
    fn lines_for_one_path_agree_on_its_fsid_and_mountpoint() {
        let t = parse_exports("/a 10.0.0.1(rw)\n/a 10.0.0.2(rw,fsid=9)\n", "ex").unwrap();
        assert_eq!(t.exports[0].id, 9, "an fsid on any line is the export's");
        let e = parse_exports("/a *(fsid=8)\n/a 10.0.0.2(fsid=9)\n", "ex").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("fsid 9"), "{e}");
        assert!(parse_exports("/a *(fsid=8)\n/a 10.0.0.2(fsid=8)\n", "ex").is_ok());
        assert!(parse_exports("/a *(mp=/x)\n/a 10.0.0.2(mp=/y)\n", "ex").is_err());
        let t = parse_exports("/a *(rw)\n/a 10.0.0.2(mp)\n", "ex").unwrap();
        assert_eq!(t.exports[0].needs_mount, Some(PathBuf::from("/a")));
        // an fsid taken by another path is refused wherever it comes
        let e = parse_exports("/b *(fsid=9)\n/a *(rw)\n/a 10.0.0.2(fsid=9)\n", "ex").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("already used by /b"), "{e}");
    }
}
