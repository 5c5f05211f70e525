//! Exports written back as exportfs -v shows them: every option spelled out, so that what
//! a file means (its defaults, `-opts` carried along a line, lines merged by path) can be
//! read before it is served.

use super::{ClientSpec, Export, ExportOptions, ExportTable, NameNotResolved};
use std::fmt::{self, Display, Formatter, Write as _};
use std::net::IpAddr;
use std::path::PathBuf;

impl Display for ClientSpec {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            ClientSpec::Anyone => f.write_str("*"),
            ClientSpec::Address(ip) => write!(f, "{ip}"),
            ClientSpec::Network(ip, prefix) => write!(f, "{ip}/{prefix}"),
            ClientSpec::Host(name, addrs) if addrs.is_empty() => write!(f, "{name} [no address]"),
            ClientSpec::Host(name, addrs) => {
                let addrs: Vec<String> = addrs.iter().map(IpAddr::to_string).collect();
                write!(f, "{name} [{}]", addrs.join(" "))
            }
            ClientSpec::Wildcard(pattern) => f.write_str(pattern),
        }
    }
}

impl Display for ExportOptions {
    /// Every option, in exportfs's order: nothing left to a default the reader must know.
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let squash = match (self.all_squash, self.root_squash) {
            (true, true) => "all_squash,root_squash",
            (true, false) => "all_squash,no_root_squash",
            (false, true) => "root_squash",
            (false, false) => "no_root_squash",
        };
        write!(
            f,
            "{},{},{},{},anonuid={},anongid={}",
            if self.read_only { "ro" } else { "rw" },
            if self.sync { "sync" } else { "async" },
            if self.secure { "secure" } else { "insecure" },
            squash,
            self.anonuid,
            self.anongid
        )
    }
}

/// Why an export of a file is not served (its directory is missing, say).
pub struct LeftOut {
    pub path: PathBuf,
    pub why: String,
}

/// The table as the server will serve it, one export after the other with its rules in
/// the file's order (a client gets the first of: its host rule, the first network that
/// holds it, the first wildcard that matches, `*`), then what was left out.
pub fn describe(table: &ExportTable, left_out: &[LeftOut]) -> String {
    let mut out = String::new();
    for e in &table.exports {
        let _ = write!(out, "{}  (id {}", e.path.display(), e.id);
        for written in &e.written_paths {
            let _ = write!(out, "; written {}", written.display());
        }
        if let Some(m) = &e.needs_mount {
            let _ = write!(out, "; served while {} is mounted", m.display());
        }
        out.push_str(")\n");
        for rule in &e.rules {
            let _ = writeln!(out, "    {}({})", rule.spec, rule.options);
        }
    }
    for l in left_out {
        let _ = writeln!(out, "{}  not served: {}", l.path.display(), l.why);
    }
    out
}

/// What `client` gets from each export: the options of the rule that admits it, and that
/// rule, or that it is refused. `name` gives the client's confirmed name, asked only if a
/// wildcard rule could decide.
pub fn describe_client(table: &ExportTable, client: IpAddr, name: impl Fn(IpAddr) -> Option<String>) -> String {
    let client = super::canonical_ip(client);
    let mut out = format!("{client}:\n");
    for e in &table.exports {
        let decided: Result<_, NameNotResolved> = e.options_with_name(client, |ip| Ok(name(ip)));
        match decided.ok().flatten() {
            Some(options) => {
                let rule = rule_of(e, options);
                let _ = writeln!(out, "    {}  {options}  (rule {rule})", e.path.display());
            }
            None => {
                let _ = writeln!(out, "    {}  refused", e.path.display());
            }
        }
    }
    out
}

/// The rule whose options these are (options are borrowed from the rule that won).
fn rule_of<'a>(e: &'a Export, options: &ExportOptions) -> &'a ClientSpec {
    &e.rules.iter().find(|r| std::ptr::eq(&r.options, options)).expect("options come from a rule of this export").spec
}

#[cfg(test)]
mod tests {
    use super::super::parse_exports_with;
    use super::*;

    fn table(text: &str) -> ExportTable {
        let resolve = |name: &str| if name == "build.lab" { vec!["10.0.0.9".parse().unwrap()] } else { Vec::new() };
        parse_exports_with(text, "ex", &resolve).expect("valid exports")
    }

    #[test]
    fn every_rule_is_shown_with_every_option_spelled_out() {
        let t = table("/srv/a -rw,no_root_squash 10.0.0.0/8 build.lab(ro) *.lab(all_squash,anonuid=1000)\n/srv/b *(fsid=7,mp)\n");
        let left_out = [LeftOut { path: "/srv/c".into(), why: "No such file or directory".into() }];
        let text = describe(&t, &left_out);
        let id_a = t.exports[0].id;
        assert_eq!(
            text,
            format!(
                "/srv/a  (id {id_a})\n\
                 \x20   10.0.0.0/8(rw,sync,secure,no_root_squash,anonuid=65534,anongid=65534)\n\
                 \x20   build.lab [10.0.0.9](ro,sync,secure,no_root_squash,anonuid=65534,anongid=65534)\n\
                 \x20   *.lab(rw,sync,secure,all_squash,no_root_squash,anonuid=1000,anongid=65534)\n\
                 /srv/b  (id 7; served while /srv/b is mounted)\n\
                 \x20   *(ro,sync,secure,root_squash,anonuid=65534,anongid=65534)\n\
                 /srv/c  not served: No such file or directory\n"
            )
        );
    }

    #[test]
    fn a_client_is_shown_the_rule_that_admits_it_or_its_refusal() {
        let t = table("/srv/a 10.0.0.0/8(rw) build.lab(ro,insecure) *.lab(rw,all_squash)\n/srv/b 192.168.1.*(rw)\n");
        let no_name = |_: IpAddr| None;
        let host = describe_client(&t, "10.0.0.9".parse().unwrap(), no_name);
        assert!(host.contains("/srv/a  ro,sync,insecure,root_squash,anonuid=65534,anongid=65534  (rule build.lab [10.0.0.9])"), "{host}");
        assert!(host.contains("/srv/b  refused"), "{host}");
        let net = describe_client(&t, "10.1.2.3".parse().unwrap(), no_name);
        assert!(net.contains("(rule 10.0.0.0/8)"), "{net}");
        let named = describe_client(&t, "172.16.0.1".parse().unwrap(), |_| Some("ws1.lab".into()));
        assert!(named.contains("rw,sync,secure,all_squash,root_squash") && named.contains("(rule *.lab)"), "{named}");
        let unnamed = describe_client(&t, "172.16.0.1".parse().unwrap(), no_name);
        assert!(unnamed.contains("/srv/a  refused"), "{unnamed}");
        // an IPv4-mapped address is the IPv4 client, as on the wire
        let mapped = describe_client(&t, "::ffff:192.168.1.20".parse().unwrap(), no_name);
        assert!(mapped.starts_with("192.168.1.20:") && mapped.contains("/srv/b  rw,"), "{mapped}");
    }
}
