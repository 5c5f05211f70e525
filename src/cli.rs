//! Command line: `nasd serve`, `nasd exports`, `nasd bench`.

use crate::exports::{parse_client_spec, parse_exports, ClientRule, Export, ExportOptions, ExportTable, LeftOut};
use crate::server::{Config, Server, UsageError};
use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "nasd", version, about = "A network-attached storage server (NFSv3 over a local directory)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve a directory (or the exports of an exports(5) file) over NFSv3.
    ///
    /// Clients mount it as "/" or by the directory's absolute path, e.g.
    /// mount -t nfs -o vers=3,proto=tcp,port=2049,mountport=2049,mountproto=tcp,nolock 127.0.0.1:/ /mnt
    Serve(ServeArgs),
    /// Benchmark nasd against peers (NFS-Ganesha, nfs:// URLs) and the local disk with fio;
    /// writes report.md, report.html, PNG plots and the raw fio JSON to --out.
    Bench(crate::bench::BenchArgs),
    /// Check an exports(5) file: print every export as nasd would serve it, each client
    /// rule with all its options spelled out, and what is left out and why; with --client,
    /// what that client gets from each export. Exits 2 if the file has an error.
    Exports(ExportsArgs),
}

#[derive(Args, Debug)]
struct ExportsArgs {
    /// The exports(5) file.
    file: PathBuf,
    /// Also show what this client address gets from each export and by which rule
    /// (repeatable; wildcard rules use its name from the resolver, as when serving).
    #[arg(long, value_name = "ADDR")]
    client: Vec<std::net::IpAddr>,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Directory to export read-write to every client that can reach the listen address.
    #[arg(conflicts_with = "exports")]
    dir: Option<PathBuf>,
    /// Address for NFS and MOUNT (TCP and UDP). Serving other hosts is a deliberate choice:
    /// the default listens on loopback only.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<SocketAddr>,
    /// exports(5) file with one or more exports and per-client options.
    #[arg(long, value_name = "FILE")]
    exports: Option<PathBuf>,
    /// TOML configuration file (listen, portmap, state_dir, runtime_dir, metrics, exports, busy_poll_us,
    /// tcp_congestion, [limits]).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Also answer portmapper/rpcbind queries on port 111, so clients can mount without
    /// naming ports and without a system rpcbind.
    #[arg(long)]
    portmap: bool,
    /// Port for --portmap.
    #[arg(long, value_name = "PORT")]
    portmap_port: Option<u16>,
    /// Where the file-handle key is kept (default /var/lib/nasd as root). Handles stay
    /// valid across restarts as long as this directory does.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// A directory on a memory file system (tmpfs) for the live duplicate request
    /// journal, copied to the state directory within 0.1 s and at a clean stop (default
    /// /run/nasd where /run is tmpfs, else $XDG_RUNTIME_DIR/nasd, else /dev/shm/nasd-UID).
    /// Elsewhere the journal is written to the state directory alone.
    #[arg(long, value_name = "DIR")]
    runtime_dir: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<SocketAddr>,
    /// After answering a client that is calling in a tight loop, poll its connection for
    /// up to this many microseconds before sleeping (0: never). Saves the wake-up of an
    /// idle CPU on every request at low concurrency (default 50), at the cost of CPU
    /// time while such a client is active; at most one connection per two cores polls.
    #[arg(long, value_name = "MICROSECONDS")]
    busy_poll_us: Option<u64>,
    /// TCP congestion control for all NFS connections (e.g. cubic, reno, bbr). Default:
    /// the system's (net.ipv4.tcp_congestion_control), except that where it paces (bbr)
    /// connections from this host get cubic (or reno): on the same host bbr paces at a bandwidth
    /// estimate that swings widely, and 1 MiB reads ran at half speed (docs/performance.md).
    #[arg(long, value_name = "NAME")]
    tcp_congestion: Option<String>,
    /// DIR mode: export read-only.
    #[arg(long, conflicts_with = "exports")]
    ro: bool,
    /// DIR mode: reply to writes before they reach the disk. Faster, but a server crash
    /// can lose data that clients were told is safe.
    #[arg(long = "async", conflicts_with = "exports")]
    async_writes: bool,
    /// DIR mode: let client root act as root (default: root is mapped to --anonuid).
    #[arg(long, conflicts_with_all = ["exports", "all_squash"])]
    no_root_squash: bool,
    /// DIR mode: map every user to --anonuid/--anongid.
    #[arg(long, conflicts_with = "exports")]
    all_squash: bool,
    /// DIR mode: uid for squashed users.
    #[arg(long, default_value_t = 65534, value_parser = crate::exports::parse_anon_id, conflicts_with = "exports")]
    anonuid: u32,
    /// DIR mode: gid for squashed users.
    #[arg(long, default_value_t = 65534, value_parser = crate::exports::parse_anon_id, conflicts_with = "exports")]
    anongid: u32,
    /// DIR mode: accept requests only from privileged source ports (below 1024).
    #[arg(long, conflicts_with = "exports")]
    secure: bool,
    /// DIR mode: clients allowed (address, CIDR, host name or wildcard); repeatable.
    /// Default: any client that can reach the listen address.
    #[arg(long, value_name = "SPEC", conflicts_with = "exports")]
    allow: Vec<String>,
    /// Requests one connection may have in flight.
    #[arg(long, value_name = "N")]
    max_requests_per_connection: Option<usize>,
    /// Requests in flight across all connections (bounds memory).
    #[arg(long, value_name = "N")]
    max_requests_in_flight: Option<usize>,
    /// Maximum simultaneous connections.
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// Entries in the duplicate request cache.
    #[arg(long, value_name = "N")]
    drc_entries: Option<usize>,
    /// Log filter (error, warn, info, debug, trace, or a tracing filter); env RUST_LOG also works.
    #[arg(long, value_name = "FILTER", default_value = "info")]
    log: String,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => exit_with(serve(args)),
        Command::Bench(args) => exit_with(crate::bench::run(args)),
        Command::Exports(args) => exit_with(check_exports(&args)),
    }
}

fn check_exports(args: &ExportsArgs) -> anyhow::Result<()> {
    init_logging("warn");
    let (table, left_out) = read_exports_file(&args.file)?;
    let mut text = crate::exports::describe(&table, &left_out);
    for &client in &args.client {
        text.push('\n');
        text.push_str(&crate::exports::describe_client(&table, client, crate::exports::confirmed_client_name));
    }
    // Into a pipe that closed early (`| head`): nothing more to say.
    match std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn exit_with(r: anyhow::Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nasd: {e:#}");
            if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

fn build_config(args: &ServeArgs) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| usage(format!("{}: {e}", path.display())))?;
            Config::from_toml(&text).map_err(|e| usage(format!("{}: {e}", path.display())))?
        }
        None => Config::default(),
    };
    if let Some(l) = args.listen {
        config.listen = l;
    }
    config.portmap |= args.portmap;
    if let Some(p) = args.portmap_port {
        config.portmap_port = p;
    }
    if let Some(d) = &args.state_dir {
        config.state_dir = Some(d.clone());
    }
    if let Some(d) = &args.runtime_dir {
        config.runtime_dir = Some(d.clone());
    }
    if let Some(m) = args.metrics {
        config.metrics = Some(m);
    }
    if let Some(us) = args.busy_poll_us {
        config.busy_poll_us = us;
    }
    if let Some(name) = &args.tcp_congestion {
        config.tcp_congestion = Some(name.clone());
    }
    if let Some(e) = &args.exports {
        config.exports = Some(e.clone());
    }
    let l = &mut config.limits;
    for (dst, src) in [
        (&mut l.max_requests_per_connection, args.max_requests_per_connection),
        (&mut l.max_requests_in_flight, args.max_requests_in_flight),
        (&mut l.max_connections, args.max_connections),
        (&mut l.drc_entries, args.drc_entries),
    ] {
        if let Some(v) = src {
            *dst = v;
        }
    }
    config.check().map_err(usage)?;
    Ok(config)
}

/// The export table for `nasd serve DIR`.
fn single_dir_exports(dir: &std::path::Path, args: &ServeArgs) -> anyhow::Result<ExportTable> {
    let path = dir.canonicalize().map_err(|e| usage(format!("{}: {e}", dir.display())))?;
    if !path.is_dir() {
        return Err(usage(format!("{} is not a directory", dir.display())));
    }
    let options = ExportOptions {
        read_only: args.ro,
        sync: !args.async_writes,
        root_squash: !args.no_root_squash,
        all_squash: args.all_squash,
        anonuid: args.anonuid,
        anongid: args.anongid,
        secure: args.secure,
    };
    let specs = if args.allow.is_empty() { vec!["*".to_string()] } else { args.allow.clone() };
    let mut rules = Vec::new();
    for spec in specs {
        // One client per flag, without options: the flags give those. exports(5) reads an
        // empty client as everyone, which an unset shell variable must not become.
        if spec.trim().is_empty() || spec.contains(char::is_whitespace) || spec.contains('(') || spec.starts_with('-') {
            return Err(usage(format!(
                "--allow {spec:?}: give one client (an address, network, host name or wildcard) per --allow, without options; the options are flags (--ro, --no-root-squash, ...)"
            )));
        }
        // Parsed alone, not as a line of a file, where a `#` or quotes could leave the line
        // with no client.
        let spec = parse_client_spec(&spec).map_err(|e| usage(format!("--allow {spec}: {e}")))?;
        rules.push(ClientRule { spec, options: options.clone(), line: 0 });
    }
    let id = crate::exports::export_id_for_path(&path);
    Ok(ExportTable { exports: vec![Export { id, path, rules, needs_mount: None, written_paths: Vec::new() }] })
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logging(&args.log);
    let config = build_config(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().max_blocking_threads(64).thread_name("nasd").build()?;
    // With an exports file, SIGHUP reads it again. Caught before the file is first read
    // and the exports open, which can take a while: a SIGHUP meanwhile (a reload right
    // after a start) must not take its default action, ending nasd. Serving a directory
    // named on the command line, nasd keeps that action, as commands run in a terminal
    // do.
    let reload_from = if args.dir.is_none() { config.exports.clone() } else { None };
    let hangup = match &reload_from {
        Some(_) => {
            let _in_runtime = runtime.enter();
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
                Ok(hangup) => Some(hangup),
                Err(e) => {
                    tracing::warn!(error = %e, "no SIGHUP handler: the exports file is read only at start");
                    None
                }
            }
        }
        None => None,
    };
    let table = match (&args.dir, &config.exports) {
        (Some(dir), _) => single_dir_exports(dir, &args)?,
        (None, Some(file)) => load_exports_file(file)?,
        (None, None) => return Err(usage("nothing to serve: give a directory or --exports FILE (see nasd serve --help)")),
    };
    // New files get exactly the mode the client asked for.
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0) };
    let last_calls_wait = std::time::Duration::from_secs(config.limits.write_timeout_secs);
    let served = runtime.block_on(async move {
        let server = Server::bind(&config, table).await?;
        if let (Some(hangup), Some(file)) = (hangup, reload_from) {
            tokio::spawn(reload_exports_on_hangup(hangup, server.reloader(), file));
        }
        server.run(shutdown_signal()).await
    });
    // Calls still running on blocking threads (a COMMIT's sync) are waited for, but not
    // for ever: a disk that stopped answering must not keep a stopped server from
    // exiting (nothing it did not answer was promised to anyone).
    let started = std::time::Instant::now();
    runtime.shutdown_timeout(last_calls_wait);
    if started.elapsed() >= last_calls_wait {
        tracing::warn!(waited_secs = last_calls_wait.as_secs(), "calls still running at exit were left unfinished");
    }
    served
}

/// Reads and checks an exports(5) file; export paths come back canonical, with the
/// exports left out and why.
fn read_exports_file(file: &std::path::Path) -> anyhow::Result<(ExportTable, Vec<LeftOut>)> {
    let text = std::fs::read_to_string(file).map_err(|e| usage(format!("{}: {e}", file.display())))?;
    let mut table = parse_exports(&text, &file.display().to_string()).map_err(|e| usage(e.to_string()))?;
    // Paths (and mount points) as the file system names them, where they resolve, and
    // exports that name one directory merged, before anything is left out: a line whose
    // `mountpoint` is not mounted must not leave another name of that directory served.
    for e in &mut table.exports {
        if let Some(m) = e.needs_mount.as_mut() {
            if let Ok(canonical) = m.canonicalize() {
                *m = canonical;
            }
        }
        if let Ok(path) = e.path.canonicalize() {
            if path != e.path {
                e.written_paths = vec![std::mem::replace(&mut e.path, path)];
            }
        }
    }
    crate::exports::merge_same_directories(&mut table).map_err(|e| usage(format!("{}: {e}", file.display())))?;
    // As exportfs: an export whose `mountpoint` is not mounted, or whose directory is
    // missing, is left out and the others are served (a reload that refused the whole file
    // would keep serving the old rules).
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut left_out = Vec::new();
    table.exports.retain(|e| {
        let why = match &e.needs_mount {
            // Checked first: below an unmounted mount point the path may not exist at all.
            Some(m) if !is_mount_point(&mounts, m) => Some(format!("its mountpoint {} is not mounted", m.display())),
            _ => e.path.canonicalize().err().map(|err| err.to_string()),
        };
        match why {
            Some(why) => {
                left_out.push(LeftOut { path: e.written_paths.first().unwrap_or(&e.path).clone(), why });
                false
            }
            None => true,
        }
    });
    Ok((table, left_out))
}

/// [`read_exports_file`] for serving: what is left out is logged.
fn load_exports_file(file: &std::path::Path) -> anyhow::Result<ExportTable> {
    let (table, left_out) = read_exports_file(file)?;
    for l in left_out {
        tracing::error!(file = %file.display(), export = %l.path.display(), "not exported: {}", l.why);
    }
    Ok(table)
}

/// Whether `path` (canonical) is where something is mounted, by `/proc/self/mountinfo`,
/// whose fifth field is the mount point with space, tab, newline and backslash written
/// in octal.
fn is_mount_point(mountinfo: &str, path: &std::path::Path) -> bool {
    let unescape = |field: &str| field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\");
    mountinfo.lines().filter_map(|l| l.split(' ').nth(4)).any(|m| std::path::Path::new(&unescape(m)) == path)
}

/// SIGHUP re-reads the exports file and serves what it says now, as `exportfs -r` does;
/// a file with an error leaves the exports as they were.
async fn reload_exports_on_hangup(mut hangup: tokio::signal::unix::Signal, reloader: crate::server::ExportReloader, file: PathBuf) {
    while hangup.recv().await.is_some() {
        let (reloader, file) = (reloader.clone(), file.clone());
        // Reading the file and opening new exports touch the disk.
        let outcome = tokio::task::spawn_blocking(move || reloader.reload(|| load_exports_file(&file))).await;
        match outcome {
            Ok(Ok(s)) => tracing::info!(kept = s.kept, added = s.added, removed = s.removed, "exports reloaded"),
            Ok(Err(e)) => tracing::error!("exports not reloaded, the previous ones are still served: {e:#}"),
            Err(e) => tracing::error!(error = %e, "exports reload failed"),
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("signal handler");
    let mut int = signal(SignalKind::interrupt()).expect("signal handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

fn init_logging(filter: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("RUST_LOG").ok().map(EnvFilter::new).unwrap_or_else(|| EnvFilter::new(filter));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exports::ClientSpec;

    #[test]
    fn mount_points_from_mountinfo() {
        let info = "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n\
                    30 22 8:2 / /srv/my\\040data rw - ext4 /dev/sdb1 rw\n\
                    31 22 0:5 / /srv/plain rw - tmpfs tmpfs rw\n\
                    32 22 0:6 / /srv/a\\011tab\\134back rw - tmpfs tmpfs rw\n";
        let is = |p: &str| is_mount_point(info, std::path::Path::new(p));
        assert!(is("/") && is("/srv/my data") && is("/srv/plain") && is("/srv/a\ttab\\back"));
        assert!(!is("/srv") && !is("/srv/plain/sub") && !is("/srv/my\\040data"));
    }

    fn serve_args(extra: &[&str]) -> ServeArgs {
        let dir = std::env::temp_dir();
        let mut argv = vec!["nasd", "serve", dir.to_str().expect("utf-8")];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).expect("parses").command {
            Command::Serve(a) => a,
            other => panic!("not serve: {other:?}"),
        }
    }

    #[test]
    fn allow_takes_one_client_and_never_opens_the_export_to_everyone_by_mistake() {
        let rules = |extra: &[&str]| {
            let args = serve_args(extra);
            single_dir_exports(args.dir.as_deref().expect("a dir"), &args).map(|t| t.exports[0].rules.clone())
        };
        let one = rules(&["--allow", "10.0.0.0/8"]).expect("a network");
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].spec, ClientSpec::Network("10.0.0.0".parse().unwrap(), 8));
        // An unset shell variable, options the flag would drop, two clients in one value, a
        // default-options token: each refused, never read as "everyone".
        for bad in ["", "  ", "10.0.0.1(rw,no_root_squash)", "a b", "-rw", "#x", "\"\"", "10.1"] {
            assert!(rules(&[&format!("--allow={bad}")]).is_err(), "--allow {bad:?} accepted");
        }
        assert_eq!(rules(&[]).expect("no --allow").len(), 1, "without --allow: everyone, on purpose");
    }
}
