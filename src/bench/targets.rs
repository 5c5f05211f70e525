//! Targets: nasd from this build, NFS-Ganesha with a generated config, an external
//! server by URL, and the local disk (the ceiling). Managed servers export a fresh
//! directory under OUT/data, on the same file system as the report.

use super::fio::Engine;
use anyhow::{bail, Context, Result};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetSpec {
    Nasd,
    Ganesha,
    Url(String),
    Local,
}

impl TargetSpec {
    pub fn parse(s: &str) -> Result<TargetSpec> {
        Ok(match s {
            "nasd" => TargetSpec::Nasd,
            "ganesha" => TargetSpec::Ganesha,
            "local" => TargetSpec::Local,
            u if u.starts_with("nfs://") => TargetSpec::Url(u.to_string()),
            other => bail!("unknown target {other:?}: use nasd, ganesha or nfs://host/export"),
        })
    }
}

/// A running target.
pub struct Target {
    /// Column name in the report.
    pub name: String,
    pub spec: TargetSpec,
    pub engine: Engine,
    /// Export root URL (NFS targets), for libnfs tools.
    pub url: Option<String>,
    /// Directory that holds the files (local target).
    pub local_dir: Option<PathBuf>,
    pub metrics: Option<SocketAddr>,
    pub version: String,
    /// How it was started (for the report).
    pub how: String,
    proc: Option<Child>,
    rpcbind: Option<Child>,
    workdir: Option<PathBuf>,
    /// (protocol, local engine) it was started with, for restart().
    started_with: (u32, String),
}

/// A port free on the loopback a moment ago, for a server the bench starts. It is taken
/// below the kernel's ephemeral range, where no outgoing connection (fio's, the bench's
/// own) can take it before the server binds it, and it is never one handed out before
/// (a server's NFS and MOUNT ports must differ though neither is bound yet).
pub fn free_port() -> Result<u16> {
    use rand::seq::SliceRandom;
    use std::sync::Mutex;
    static HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let mut candidates: Vec<u16> = (low.saturating_sub(12000).max(1024)..low).collect();
    candidates.shuffle(&mut rand::thread_rng());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let port = candidates
        .into_iter()
        .find(|port| {
            !handed_out.contains(port)
                && TcpListener::bind(("127.0.0.1", *port)).is_ok()
                && std::net::UdpSocket::bind(("127.0.0.1", *port)).is_ok()
        })
        .with_context(|| format!("no free port on 127.0.0.1 below the ephemeral range ({low})"))?;
    handed_out.push(port);
    Ok(port)
}

fn wait_tcp(port: u16, proc: &mut Child, what: &str, log: &Path, timeout: Duration) -> Result<()> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(st) = proc.try_wait()? {
            bail!("{what} exited ({st}) before listening on port {port}\n{}", tail(log));
        }
        if TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_millis(300)).is_ok() {
            return Ok(());
        }
        if Instant::now() > end {
            bail!("{what} did not listen on port {port} within {timeout:?}\n{}", tail(log));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn tail(log: &Path) -> String {
    let t = std::fs::read_to_string(log).unwrap_or_default();
    let n = t.len().saturating_sub(3000);
    format!("--- {} ---\n{}", log.display(), &t[t.char_indices().find(|(i, _)| *i >= n).map(|(i, _)| i).unwrap_or(0)..])
}

fn stop_child(c: &mut Child, timeout: Duration) {
    if let Ok(Some(_)) = c.try_wait() {
        return;
    }
    unsafe {
        libc::kill(c.id() as i32, libc::SIGTERM);
    }
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = c.kill();
    let _ = c.wait();
}

fn dpkg_version(pkg: &str) -> String {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", pkg])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

pub fn ganesha_available() -> bool {
    which("ganesha.nfsd").is_some()
}

pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file())
}

fn ganesha_plugins_dir() -> Option<PathBuf> {
    let mut cands: Vec<PathBuf> = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/usr/lib") {
        for e in rd.flatten() {
            cands.push(e.path().join("ganesha"));
        }
    }
    cands.push("/usr/lib64/ganesha".into());
    cands.push("/usr/lib/ganesha".into());
    cands.sort();
    cands.into_iter().find(|d| d.join("libfsalvfs.so").exists())
}

/// Ganesha configuration: NFSv3 + v4 over TCP on loopback, FSAL VFS over `export`.
pub fn ganesha_config(export: &Path, port: u16, mount_port: u16, workdir: &Path) -> String {
    let plug = ganesha_plugins_dir().map(|d| format!("    Plugins_Dir = \"{}\";\n", d.display())).unwrap_or_default();
    format!(
        r#"# generated by nasd bench
NFS_CORE_PARAM {{
    Bind_Addr = 127.0.0.1;
    NFS_Port = {port};
    MNT_Port = {mount_port};
    Protocols = 3, 4;
    Enable_NLM = false;
    Enable_RQUOTA = false;
    Enable_UDP = false;
{plug}}}
NFS_KRB5 {{
    Active_krb5 = false;
}}
NFSV4 {{
    Graceless = true;
    RecoveryBackend = fs;
    RecoveryRoot = "{recovery}";
}}
EXPORT {{
    Export_Id = 1;
    Path = "{export}";
    Pseudo = "/export";
    Access_Type = RW;
    Squash = No_Root_Squash;
    SecType = sys;
    Protocols = 3, 4;
    Transports = TCP;
    FSAL {{
        Name = VFS;
    }}
}}
LOG {{
    Default_Log_Level = EVENT;
}}
"#,
        recovery = workdir.join("recovery").display(),
        export = export.display()
    )
}

impl Target {
    /// Start (or, for URLs, just describe) a target. `work` is a fresh directory for it.
    pub fn start(spec: &TargetSpec, work: &Path, protocol: u32, local_engine: &str) -> Result<Target> {
        std::fs::create_dir_all(work)?;
        let work = work.canonicalize()?;
        match spec {
            TargetSpec::Nasd => {
                if protocol != 3 {
                    bail!("nasd serves NFSv3 only: run --protocol v4 against ganesha or a URL target");
                }
                let export = work.join("export");
                let state = work.join("state");
                std::fs::create_dir_all(&export)?;
                std::fs::create_dir_all(&state)?;
                let port = free_port()?;
                let mport = free_port()?;
                let exe = std::env::current_exe().context("locating the nasd executable")?;
                let log = work.join("nasd.log");
                let mut args: Vec<String> = vec![
                    "serve".into(),
                    export.display().to_string(),
                    "--listen".into(),
                    format!("127.0.0.1:{port}"),
                    "--state-dir".into(),
                    state.display().to_string(),
                    "--metrics".into(),
                    format!("127.0.0.1:{mport}"),
                    "--no-root-squash".into(),
                    "--log".into(),
                    "warn".into(),
                ];
                if let Some(run) = runtime_dir(&work) {
                    args.extend(["--runtime-dir".into(), run.display().to_string()]);
                }
                let logf = std::fs::File::create(&log)?;
                let mut proc = Command::new(&exe)
                    .args(&args)
                    .stdin(Stdio::null())
                    .stdout(logf.try_clone()?)
                    .stderr(logf)
                    .spawn()
                    .with_context(|| format!("starting {}", exe.display()))?;
                if let Err(e) = wait_tcp(port, &mut proc, "nasd", &log, Duration::from_secs(20)) {
                    stop_child(&mut proc, Duration::from_secs(3));
                    return Err(e);
                }
                let url = format!("nfs://127.0.0.1{}?nfsport={port}&mountport={port}&version=3", export.display());
                Ok(Target {
                    name: "nasd".into(),
                    spec: spec.clone(),
                    engine: Engine::Nfs { url: url.clone() },
                    url: Some(url),
                    local_dir: None,
                    metrics: Some(SocketAddr::from(([127, 0, 0, 1], mport))),
                    version: format!("nasd {}", env!("CARGO_PKG_VERSION")),
                    how: format!("nasd {} (sync writes, the default)", args.join(" ")),
                    proc: Some(proc),
                    rpcbind: None,
                    workdir: Some(work),
                    started_with: (protocol, local_engine.into()),
                })
            }
            TargetSpec::Ganesha => {
                if !ganesha_available() {
                    bail!("ganesha.nfsd not found: apt-get install nfs-ganesha nfs-ganesha-vfs rpcbind");
                }
                let export = work.join("export");
                std::fs::create_dir_all(&export)?;
                std::fs::create_dir_all(work.join("recovery"))?;
                let port = free_port()?;
                let mount_port = free_port()?;
                let conf = work.join("ganesha.conf");
                std::fs::write(&conf, ganesha_config(&export, port, mount_port, &work))?;
                // NFSv3 needs rpcbind (Ganesha registers over its unix socket).
                let mut rpcbind = None;
                if UnixStream::connect("/run/rpcbind.sock").is_err() {
                    if which("rpcbind").is_none() {
                        bail!("rpcbind not found (apt-get install rpcbind): Ganesha's NFSv3 needs it");
                    }
                    let c = Command::new("rpcbind")
                        .args(["-f", "-w"])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()?;
                    let end = Instant::now() + Duration::from_secs(10);
                    while UnixStream::connect("/run/rpcbind.sock").is_err() {
                        if Instant::now() > end {
                            bail!("rpcbind did not come up");
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    rpcbind = Some(c);
                }
                let log = work.join("ganesha.log");
                let args: Vec<String> = vec![
                    "-F".into(),
                    "-f".into(),
                    conf.display().to_string(),
                    "-L".into(),
                    log.display().to_string(),
                    "-p".into(),
                    work.join("ganesha.pid").display().to_string(),
                    "-N".into(),
                    "NIV_EVENT".into(),
                ];
                let mut proc = Command::new("ganesha.nfsd")
                    .args(&args)
                    .stdin(Stdio::null())
                    .stdout(std::fs::File::create(work.join("stdout.log"))?)
                    .stderr(Stdio::null())
                    .spawn()
                    .context("starting ganesha.nfsd")?;
                let started = wait_tcp(port, &mut proc, "ganesha.nfsd", &log, Duration::from_secs(30))
                    .and_then(|_| wait_tcp(mount_port, &mut proc, "ganesha.nfsd", &log, Duration::from_secs(30)));
                if let Err(e) = started {
                    stop_child(&mut proc, Duration::from_secs(5));
                    if let Some(mut r) = rpcbind {
                        stop_child(&mut r, Duration::from_secs(3));
                    }
                    return Err(e);
                }
                let url = if protocol == 4 {
                    format!("nfs://127.0.0.1/export?version=4&nfsport={port}")
                } else {
                    format!("nfs://127.0.0.1{}?nfsport={port}&mountport={mount_port}&version=3", export.display())
                };
                Ok(Target {
                    name: "ganesha".into(),
                    spec: spec.clone(),
                    engine: Engine::Nfs { url: url.clone() },
                    url: Some(url),
                    local_dir: None,
                    metrics: None,
                    version: format!("nfs-ganesha {}", dpkg_version("nfs-ganesha")),
                    how: "ganesha.nfsd -F -f ganesha.conf (FSAL VFS, generated config in the report directory's data/ganesha)".into(),
                    proc: Some(proc),
                    rpcbind,
                    workdir: Some(work),
                    started_with: (protocol, local_engine.into()),
                })
            }
            TargetSpec::Url(u) => {
                let mut url = u.clone();
                if !url.contains("version=") {
                    url.push(if url.contains('?') { '&' } else { '?' });
                    url.push_str(&format!("version={protocol}"));
                }
                Ok(Target {
                    name: url_target_name(u),
                    spec: spec.clone(),
                    engine: Engine::Nfs { url: url.clone() },
                    url: Some(url),
                    local_dir: None,
                    metrics: None,
                    version: "external".into(),
                    how: format!("external server {u}"),
                    proc: None,
                    rpcbind: None,
                    workdir: None,
                    started_with: (protocol, local_engine.into()),
                })
            }
            TargetSpec::Local => Ok(Target {
                name: "local".into(),
                spec: spec.clone(),
                engine: Engine::Local { engine: local_engine.into(), dir: work.clone() },
                url: None,
                local_dir: Some(work.clone()),
                metrics: None,
                version: "-".into(),
                how: format!("local file system, fio ioengine={local_engine} direct=1"),
                proc: None,
                rpcbind: None,
                workdir: Some(work),
                started_with: (protocol, local_engine.into()),
            }),
        }
    }

    /// Where the target's files are on this machine (managed servers and local).
    pub fn data_dir(&self) -> Option<PathBuf> {
        match self.spec {
            TargetSpec::Local => self.local_dir.clone(),
            TargetSpec::Nasd | TargetSpec::Ganesha => self.workdir.as_ref().map(|w| w.join("export")),
            TargetSpec::Url(_) => None,
        }
    }

    pub fn is_local(&self) -> bool {
        self.spec == TargetSpec::Local
    }

    /// Process id of the server the bench started (none for external servers and the
    /// local disk).
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(|p| p.id())
    }

    /// Is the managed server still running?
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(p) = &mut self.proc {
            if let Some(st) = p.try_wait()? {
                bail!("{} exited ({st})", self.name);
            }
        }
        Ok(())
    }

    /// Start a managed server again over the same data (after it died).
    pub fn restart(&mut self) -> Result<()> {
        let Some(work) = self.workdir.clone() else { return Ok(()) };
        if self.proc.is_none() {
            return Ok(());
        }
        self.stop();
        let (protocol, engine) = self.started_with.clone();
        let fresh = Target::start(&self.spec, &work, protocol, &engine)?;
        *self = fresh;
        Ok(())
    }

    pub fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            stop_child(&mut p, Duration::from_secs(10));
            // Stopped, nasd has copied its live journal to the state directory (and a
            // restart over the same data, after a crash, needs none of its replies).
            if let (TargetSpec::Nasd, Some(run)) = (&self.spec, self.workdir.as_deref().and_then(runtime_dir)) {
                let _ = std::fs::remove_dir_all(run);
            }
        }
        if let Some(mut r) = self.rpcbind.take() {
            stop_child(&mut r, Duration::from_secs(5));
        }
    }

    /// Remove the target's data (after stop).
    pub fn cleanup(&mut self) {
        if let Some(w) = self.workdir.take() {
            let _ = std::fs::remove_dir_all(w.join("export"));
            if self.is_local() {
                let _ = std::fs::remove_dir_all(&w);
            }
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where a nasd the bench starts in `work` keeps its live duplicate request journal: a
/// directory of its own on the memory file system at /dev/shm (as a server's default
/// would be), removed when the bench stops it.
fn runtime_dir(work: &Path) -> Option<PathBuf> {
    let shm = Path::new("/dev/shm");
    let name = blake3::hash(work.as_os_str().as_encoded_bytes()).to_hex();
    crate::fh::on_memory_file_system(shm).then(|| shm.join(format!("nasd-bench-{}", &name[..16])))
}

/// The report's name for an external server: its host, and its port when the URL gives one
/// (two servers on one host, e.g. two builds compared, must not share a column).
fn url_target_name(url: &str) -> String {
    let host = url.trim_start_matches("nfs://").split(['/', ':', '?']).next().unwrap_or("");
    let port = url.split_once('?').and_then(|(_, q)| q.split('&').find_map(|kv| kv.strip_prefix("nfsport=")));
    match port {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    }
}

/// Makes target names unique for the report: a repeated name gets " (2)", " (3)", ...
pub fn make_names_unique(names: &mut [String]) {
    for i in 1..names.len() {
        if names[..i].contains(&names[i]) {
            let base = names[i].clone();
            let mut n = 2;
            while names.contains(&format!("{base} ({n})")) {
                n += 1;
            }
            names[i] = format!("{base} ({n})");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_stay_below_the_ephemeral_range_and_never_repeat() {
        let low: u16 =
            std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap().split_whitespace().next().unwrap().parse().unwrap();
        let ports: Vec<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        assert!(ports.iter().all(|p| (1024..low).contains(p)), "{ports:?}");
        TcpListener::bind(("127.0.0.1", ports[0])).expect("the port is still free");
    }

    #[test]
    fn external_servers_on_one_host_get_their_own_names() {
        assert_eq!(url_target_name("nfs://127.0.0.1/srv?nfsport=2049&mountport=2049"), "127.0.0.1:2049");
        assert_eq!(url_target_name("nfs://127.0.0.1/srv?mountport=20048&nfsport=2050"), "127.0.0.1:2050");
        assert_eq!(url_target_name("nfs://filer/export"), "filer");
        let mut names: Vec<String> = ["nasd", "filer", "filer", "filer (2)", "filer"].map(String::from).to_vec();
        make_names_unique(&mut names);
        assert_eq!(names, ["nasd", "filer", "filer (3)", "filer (2)", "filer (4)"].map(String::from).to_vec());
    }
}
