//! The server: configuration, listeners, per-connection tasks, limits and shutdown.

mod busy_poll;
mod config;
mod congestion;
mod metrics_http;
mod stalls;
pub mod state;
mod tcp;
mod udp;

use busy_poll::BusyPoll;
pub use config::{Config, Limits};
pub(crate) use congestion::paces;

use crate::backend::local::{creds, ChangeCount, LocalConfig, LocalFs};
use crate::exports::{Export, ExportTable};
use crate::fh::HandleKey;
use crate::metrics::Metrics;
use crate::mount3::Mount3;
use crate::nfs3::Nfs3;
use crate::portmap::Portmap;
use crate::rpc::dispatch::Dispatcher;
use crate::rpc::drc::JournalPlace;
use crate::rpc::record::{RecordLimits, RecordPool};
use crate::rpc::RpcProgram;
use anyhow::Context;
use stalls::Stalls;
use state::{ExportRuntime, ServerState};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Record buffers kept for reuse: enough for a client's 16–32 large WRITEs in flight,
/// ~32 MiB at most while idle.
const RECORD_BUFFERS_KEPT: usize = 32;

/// Everything a connection task needs.
pub(crate) struct Shared {
    pub dispatcher: Dispatcher,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    pub record_limits: RecordLimits,
    /// Requests in flight across all connections.
    pub global_requests: Arc<Semaphore>,
    pub busy_poll: BusyPoll,
    /// Buffers of finished requests, reused for the next records.
    pub record_pool: RecordPool,
    /// The exports, for the UDP reply guard (which clients may get large replies).
    pub state: Arc<ServerState>,
    /// Connections that may hold slots without progress, closed when others wait.
    pub stalls: Stalls,
    /// Open TCP connections, on all listeners together.
    pub connections: Arc<Semaphore>,
    /// The congestion control each accepted connection gets.
    pub congestion: congestion::Policy,
    /// Held while anything of this server runs, calls still on blocking threads after
    /// the listeners stopped included ([`lock_state_dir`]).
    _state_dir_lock: std::fs::File,
}

impl Shared {
    /// A global request slot. While none is free, connections stalled with slots are
    /// closed (see `stalls`), other than the caller's own (`except`).
    pub async fn global_slot(&self, except: Option<u64>) -> OwnedSemaphorePermit {
        if let Ok(slot) = self.global_requests.clone().try_acquire_owned() {
            return slot;
        }
        // One acquire throughout, so the caller keeps its place in the queue.
        let mut acquire = std::pin::pin!(self.global_requests.clone().acquire_owned());
        loop {
            match tokio::time::timeout(stalls::PRESSURE_CHECK, &mut acquire).await {
                Ok(slot) => return slot.expect("never closed"),
                Err(_) => {
                    self.stalls.close_stalled(except);
                }
            }
        }
    }
}

/// A bound server, ready to run.
pub struct Server {
    shared: Arc<Shared>,
    tcp: Vec<TcpListener>,
    udp: Vec<Arc<UdpSocket>>,
    metrics_listener: Option<TcpListener>,
    local_addr: SocketAddr,
    reloader: ExportReloader,
}

/// Startup failures that are the user's to fix (exit status 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

async fn bind_tcp(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => " (the address is in use: is another NFS server running?)",
            std::io::ErrorKind::PermissionDenied => " (ports below 1024 need root)",
            _ => "",
        };
        UsageError(format!("cannot listen on {addr}: {e}{hint}")).into()
    })
}

/// The loopback addresses (`127.0.0.1`, `::1`) a listener on `listen` does not answer
/// on. The portmapper listens there too, as rpcbind listens on every address: programs
/// on this host register with it there (libtirpc's `rpcb_set`, which rpc.statd calls,
/// goes to `::1`; portmap version 2 clients to `127.0.0.1`).
/// `dual_stack`: whether a socket on `::` also answers IPv4 (net.ipv6.bindv6only is 0).
fn loopbacks_not_covered_by(listen: IpAddr, dual_stack: bool) -> Vec<IpAddr> {
    let v4_loopback = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    let v6_loopback = IpAddr::V6(std::net::Ipv6Addr::LOCALHOST);
    let covers = |loopback: IpAddr| {
        listen == loopback || listen.is_unspecified() && (listen.is_ipv6() == loopback.is_ipv6() || listen.is_ipv6() && dual_stack)
    };
    [v4_loopback, v6_loopback].into_iter().filter(|&loopback| !covers(loopback)).collect()
}

async fn bind_udp(addr: SocketAddr) -> anyhow::Result<UdpSocket> {
    let socket = UdpSocket::bind(addr).await.map_err(|e| UsageError(format!("cannot listen on udp {addr}: {e}")))?;
    if addr.ip().is_unspecified() {
        udp::report_destinations(&socket, addr)
            .map_err(|e| UsageError(format!("udp {addr}: cannot learn the address each datagram was sent to: {e}")))?;
    }
    Ok(socket)
}

/// File in the state directory that keeps namespace changes' replies across restarts.
const DRC_JOURNAL: &str = "drc-journal";

/// The live duplicate request journal's file in `runtime_dir`, made private to this
/// server if need be; `None` (the journal goes to the state directory alone) where the
/// directory is not on a memory file system, an error where it cannot be used. Named by
/// the state directory's key and inode: a copy of the state directory run by a second
/// server on the same machine gets a live journal of its own.
fn live_journal_path(
    runtime_dir: &std::path::Path,
    state_dir: &std::path::Path,
    key_fingerprint: &[u8; 16],
) -> anyhow::Result<Option<std::path::PathBuf>> {
    use std::os::unix::fs::MetadataExt;
    // Not made yet: where it would be made.
    let probe = if runtime_dir.exists() { runtime_dir } else { runtime_dir.parent().unwrap_or(runtime_dir) };
    if !crate::fh::on_memory_file_system(probe) {
        tracing::info!(runtime_dir = %runtime_dir.display(), "not on a memory file system: the duplicate request journal is written to the state directory");
        return Ok(None);
    }
    crate::fh::private_dir(runtime_dir, "runtime directory")?;
    let state = std::fs::metadata(state_dir).with_context(|| format!("state directory {}", state_dir.display()))?;
    let mut name = blake3::Hasher::new();
    name.update(key_fingerprint).update(&state.dev().to_le_bytes()).update(&state.ino().to_le_bytes());
    let name = name.finalize().to_hex();
    Ok(Some(runtime_dir.join(format!("{DRC_JOURNAL}-{}", &name[..16]))))
}

/// Takes the state directory for this process alone (an `flock` of `lock` in it, which
/// goes with the process however it ends): two servers on one directory would overwrite
/// each other's duplicate request journal, and two first starts at once could each
/// serve handles made with a key the other then installs.
fn lock_state_dir(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    crate::fh::private_dir(dir, "state directory").with_context(|| format!("state directory {} (set --state-dir)", dir.display()))?;
    let path = dir.join("lock");
    let file = crate::fh::open_private_file(&path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: plain syscall on an open descriptor.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            return Err(UsageError(format!(
                "state directory {} is in use by another nasd: give each server its own (--state-dir)",
                dir.display()
            ))
            .into());
        }
        // A file system that cannot lock (NFS without lockd): serve, as before there was a
        // lock, and say what is not guarded.
        tracing::warn!(state_dir = %dir.display(), error = %e, "cannot lock the state directory: nothing stops a second server from using it too");
    }
    Ok(file)
}

impl Server {
    /// Opens every export and binds every listener; nothing is served until [`Server::run`].
    pub async fn bind(config: &Config, table: ExportTable) -> anyhow::Result<Server> {
        if table.exports.is_empty() {
            return Err(UsageError("nothing to export".into()).into());
        }
        config.check().map_err(UsageError)?;
        if !creds::init() {
            tracing::warn!("not running as root: every client acts as the server's own user");
        }
        creds::check_switching().map_err(UsageError)?;
        raise_fd_limit();
        let state_dir = config.state_dir();
        let state_dir_lock = lock_state_dir(&state_dir)?;
        let key =
            HandleKey::load_or_create(&state_dir).with_context(|| format!("state directory {} (set --state-dir)", state_dir.display()))?;
        let changes = ChangeCount::default();
        let mut exports = Vec::new();
        for export in table.exports {
            exports.push(open_export(export, &config.limits, &changes)?);
        }
        let mut metrics = Metrics::new();
        metrics.register(crate::nfs3::xdr::PROGRAM, "nfs3", &crate::nfs3::xdr::proc::NAMES);
        metrics.register(crate::mount3::PROGRAM, "mount3", &crate::mount3::proc::NAMES);
        metrics.register(crate::portmap::PROGRAM, "portmap", &crate::portmap::proc::NAMES);
        let metrics = Arc::new(metrics);
        let key_fingerprint = key.fingerprint();
        let state = Arc::new(ServerState::new(exports, key, metrics.clone()));

        let main_tcp = bind_tcp(config.listen).await?;
        let local_addr = main_tcp.local_addr()?;
        state.nfs_port.store(local_addr.port(), Ordering::Relaxed);
        let mut tcp = vec![main_tcp];
        let mut udp = vec![Arc::new(bind_udp(local_addr).await?)];
        let pmap_port = if config.portmap { config.portmap_port } else { local_addr.port() };
        if config.portmap {
            let addr = SocketAddr::new(config.listen.ip(), config.portmap_port);
            tcp.push(bind_tcp(addr).await?);
            udp.push(Arc::new(bind_udp(addr).await?));
            // Sockets on `::` take both families unless the machine says otherwise.
            let dual_stack = std::fs::read_to_string("/proc/sys/net/ipv6/bindv6only").map_or(true, |v| v.trim() == "0");
            for ip in loopbacks_not_covered_by(config.listen.ip(), dual_stack) {
                let addr = SocketAddr::new(ip, config.portmap_port);
                match (bind_tcp(addr).await, bind_udp(addr).await) {
                    (Ok(t), Ok(u)) => {
                        tcp.push(t);
                        udp.push(Arc::new(u));
                    }
                    (Err(e), _) | (_, Err(e)) => {
                        tracing::warn!(%addr, "programs on this host cannot register with the portmapper there: {e:#}")
                    }
                }
            }
        }
        let congestion = congestion::Policy::apply(&tcp, config.tcp_congestion.as_deref())?;
        let metrics_listener = match config.metrics {
            Some(addr) => Some(bind_tcp(addr).await?),
            None => None,
        };
        let programs: Vec<Arc<dyn RpcProgram>> = vec![
            Arc::new(Nfs3::new(state.clone())),
            Arc::new(Mount3::new(state.clone())),
            Arc::new(Portmap::new(state.nfs_port.clone(), pmap_port)),
        ];
        let busy_poll = BusyPoll::new(std::time::Duration::from_micros(config.busy_poll_us), metrics.busy_poll.clone());
        let kept_journal = state_dir.join(DRC_JOURNAL);
        let live_journal = config.runtime_dir().and_then(|dir| {
            live_journal_path(&dir, &state_dir, &key_fingerprint).unwrap_or_else(|e| {
                tracing::warn!(error = format!("{e:#}"), "the duplicate request journal is written to the state directory");
                None
            })
        });
        let journal = match &live_journal {
            Some(live) => JournalPlace::Mirrored { live, kept: &kept_journal },
            None => JournalPlace::Direct(&kept_journal),
        };
        let shared = Arc::new(Shared {
            dispatcher: Dispatcher::new(programs, config.limits.drc_entries, metrics.clone())
                .with_drc_journal(journal, || {
                    make_exports_durable(&state, std::time::Duration::from_secs(config.limits.start_sync_timeout_secs))
                })
                .with_context(|| format!("duplicate request journal in {}", state_dir.display()))?,
            metrics,
            limits: config.limits.clone(),
            record_limits: RecordLimits { max_record: config.limits.max_record_bytes, max_fragments: 1024 },
            global_requests: Arc::new(Semaphore::new(config.limits.max_requests_in_flight)),
            busy_poll,
            record_pool: RecordPool::new(RECORD_BUFFERS_KEPT),
            state: state.clone(),
            stalls: Stalls::new(std::time::Duration::from_secs(config.limits.stall_timeout_secs)),
            connections: Arc::new(Semaphore::new(config.limits.max_connections)),
            congestion,
            _state_dir_lock: state_dir_lock,
        });
        let reloader = ExportReloader { state: state.clone(), limits: config.limits.clone(), changes };
        Ok(Server { shared, tcp, udp, metrics_listener, local_addr, reloader })
    }

    /// What applies a new export table to this server once it runs.
    pub fn reloader(&self) -> ExportReloader {
        self.reloader.clone()
    }

    /// The NFS/MOUNT listening address (useful when binding port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` completes.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
        let mut tasks = tokio::task::JoinSet::new();
        for l in self.tcp {
            tracing::info!(addr = %l.local_addr()?, "listening (tcp)");
            tasks.spawn(tcp::accept_loop(l, self.shared.clone()));
        }
        for s in self.udp {
            tracing::info!(addr = %s.local_addr()?, "listening (udp)");
            tasks.spawn(udp::serve(s, self.shared.clone()));
        }
        if let Some(l) = self.metrics_listener {
            tracing::info!(addr = %l.local_addr()?, "metrics at /metrics");
            tasks.spawn(metrics_http::serve(l, self.shared.metrics.clone()));
        }
        shutdown.await;
        tracing::info!("shutting down");
        tasks.abort_all();
        if let Err(e) = self.shared.dispatcher.drc().flush_journal() {
            tracing::warn!(error = %e, "the duplicate request journal could not be copied to the state directory: the last replies outlive this process, not a reboot");
        }
        drop(self.shared);
        Ok(())
    }
}

/// Whether an export is served `sync`. All clients of an export share one backend, so
/// durability is per export: `async` only if every client rule says so. Data a client was
/// told is safe must be, whatever another client's rule asks for.
fn export_is_sync(export: &Export) -> bool {
    let all_async = !export.rules.is_empty() && export.rules.iter().all(|r| !r.options.sync);
    !all_async
}

/// Opens the storage behind one export.
fn open_export(export: Export, limits: &Limits, changes: &ChangeCount) -> anyhow::Result<ExportRuntime> {
    if !export.path.is_dir() {
        return Err(UsageError(format!("export {} is not a directory", export.path.display())).into());
    }
    let sync = export_is_sync(&export);
    if sync && export.rules.iter().any(|r| !r.options.sync) {
        tracing::warn!(
            export = %export.path.display(),
            "some clients of this export are 'async' and others 'sync': all are served 'sync'"
        );
    }
    let vfs = LocalFs::open(&LocalConfig {
        path: export.path.clone(),
        fsid: export.id as u64,
        sync,
        cache_capacity: limits.open_objects,
        cache_idle: (limits.open_object_idle_secs > 0).then(|| std::time::Duration::from_secs(limits.open_object_idle_secs)),
        changes: changes.clone(),
    })
    .map_err(|e| UsageError(format!("{e:#}")))?;
    tracing::info!(path = %export.path.display(), id = export.id, sync, "exporting");
    // The directory the storage opened, not a second look at the path, which a mount
    // made meanwhile could already lead elsewhere.
    let root = vfs.root_identity();
    Ok(ExportRuntime { export, vfs, root })
}

/// Device and inode of a directory: which directory a path leads to now.
fn dir_identity(path: &std::path::Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map(|m| (m.dev(), m.ino()))
}

/// Applies a new export table to a running server, as `exportfs -r` does for knfsd: new
/// client rules and options take effect with the next call, exports can be added and
/// removed, and clients of an export that stays keep their mounts and file handles.
#[derive(Clone)]
pub struct ExportReloader {
    state: Arc<ServerState>,
    limits: Limits,
    changes: ChangeCount,
}

/// What a reload changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReloadSummary {
    pub added: usize,
    pub removed: usize,
    pub kept: usize,
}

impl ExportReloader {
    /// Reads a new export table with `read` and serves it ([`Self::apply`]), both as the
    /// server itself: the thread this runs on may still act as the last client it served.
    pub fn reload(&self, read: impl FnOnce() -> anyhow::Result<ExportTable>) -> anyhow::Result<ReloadSummary> {
        creds::become_root();
        self.apply(read()?)
    }

    /// Serves `table` from now on. An export with the same id, path and durability as one
    /// served now keeps its storage (open files, caches); any other is opened afresh. On
    /// an error nothing changes. Blocks on the file system: call it where that may wait.
    pub fn apply(&self, table: ExportTable) -> anyhow::Result<ReloadSummary> {
        // The thread may still act as the last client it served; exports open as the server.
        creds::become_root();
        if table.exports.is_empty() {
            // As `exportfs -r` with nothing left to export (every export's `mountpoint`
            // may be unmounted): every client is refused until there is something again.
            tracing::warn!("no exports any more: every client is refused");
        }
        let current = self.state.exports();
        let mut summary = ReloadSummary::default();
        let mut next = Vec::with_capacity(table.exports.len());
        for export in table.exports {
            let same = current.iter().find(|rt| {
                rt.export.id == export.id && rt.export.path == export.path && export_is_sync(&rt.export) == export_is_sync(&export)
            });
            // A file system mounted on the path since (a disk that was late at boot)
            // replaces the directory underneath, as `exportfs -r` would: kept, the old
            // storage would go on serving, and filling, the directory under the mount.
            let same = same.filter(|rt| {
                let now = dir_identity(&export.path).ok();
                if now != Some(rt.root) {
                    tracing::info!(export = %export.path.display(), "the export's path leads to another directory now (a file system mounted on it, or the directory replaced): opened afresh");
                }
                now == Some(rt.root)
            });
            let rt = match same {
                Some(rt) => {
                    summary.kept += 1;
                    ExportRuntime { export, vfs: rt.vfs.clone(), root: rt.root }
                }
                None => {
                    summary.added += 1;
                    open_export(export, &self.limits, &self.changes)?
                }
            };
            next.push(Arc::new(rt));
        }
        summary.removed = current.len() - summary.kept;
        self.state.replace_exports(next);
        Ok(summary)
    }
}

/// Makes every change to the exports durable, those of a killed earlier process
/// included; false if any could not be, or not `within` that time. A file system whose
/// writeback hangs (a dead device or remote server, a file system frozen for a snapshot)
/// would otherwise keep the server from ever serving. Past the bound it serves; if the
/// exports themselves were not made durable by then, the earlier process's replies put
/// aside are dropped, so their calls run again when resent. The sync goes on in the
/// kernel.
fn make_exports_durable(state: &Arc<ServerState>, within: std::time::Duration) -> bool {
    use std::sync::mpsc::RecvTimeoutError;
    // A bound too far off to be a deadline is no bound.
    let deadline = std::time::Instant::now().checked_add(within);
    let (done, outcome) = std::sync::mpsc::channel();
    let state = state.clone();
    let started = std::thread::Builder::new().name("nasd-start-sync".into()).spawn(move || {
        let _ = done.send(exports_durable(&state));
        // An export the earlier process served may be gone from the table now; sync(2)
        // reaches its file system too (it reports no errors: the exports' own syncs do).
        // SAFETY: no arguments, no memory shared.
        unsafe { libc::sync() };
        let _ = done.send(true);
    });
    if let Err(e) = started {
        tracing::warn!(error = %e, "no thread to make the exports durable at start");
        return false;
    }
    let wait = || match deadline {
        Some(deadline) => outcome.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())),
        None => outcome.recv().map_err(|_| RecvTimeoutError::Disconnected),
    };
    match wait() {
        Ok(true) => {}
        Ok(false) => return false,
        Err(RecvTimeoutError::Timeout) => {
            tracing::warn!(
                seconds = within.as_secs(),
                "the exports' file systems did not finish syncing at start: serving without waiting longer"
            );
            return false;
        }
        Err(RecvTimeoutError::Disconnected) => {
            tracing::error!("making the exports durable at start failed (the thread doing it panicked)");
            return false;
        }
    }
    // The exports are durable; what sync(2) covers besides is only what an earlier process
    // may have served from exports since taken out of the table. A hung file system
    // elsewhere on the machine must not cost the exports' clients their replies.
    if wait().is_err() {
        tracing::warn!(
            seconds = within.as_secs(),
            "file systems other than the exports did not finish syncing at start (sync(2)); the exports are durable, their replies are kept"
        );
    }
    true
}

fn exports_durable(state: &ServerState) -> bool {
    state.exports().iter().all(|rt| match rt.vfs.make_all_durable() {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(export = %rt.export.path.display(), error = ?e, "could not make the export's changes durable at start");
            false
        }
    })
}

/// Open objects and connections each hold descriptors; ask for as many as allowed.
fn raise_fd_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain getrlimit/setrlimit with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max.min(1 << 20);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_portmapper_also_listens_on_each_loopback_its_listen_address_misses() {
        let loopbacks = |listen: &str| -> Vec<String> {
            loopbacks_not_covered_by(listen.parse().unwrap(), true).iter().map(|ip| ip.to_string()).collect()
        };
        assert_eq!(loopbacks("127.0.0.1"), ["::1"]);
        assert_eq!(loopbacks("0.0.0.0"), ["::1"]);
        assert_eq!(loopbacks("::1"), ["127.0.0.1"]);
        assert_eq!(loopbacks("::"), Vec::<String>::new());
        assert_eq!(loopbacks("127.0.0.2"), ["127.0.0.1", "::1"]);
        assert_eq!(loopbacks("192.0.2.7"), ["127.0.0.1", "::1"]);
        assert_eq!(loopbacks("2001:db8::7"), ["127.0.0.1", "::1"]);
        // Where `::` is IPv6 alone (net.ipv6.bindv6only = 1).
        assert_eq!(loopbacks_not_covered_by("::".parse().unwrap(), false), ["127.0.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(loopbacks_not_covered_by("0.0.0.0".parse().unwrap(), false), ["::1".parse::<IpAddr>().unwrap()]);
    }
}
