//! Server configuration: built from the command line, optionally from a TOML file.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// NFS and MOUNT listen address (TCP and UDP).
    pub listen: SocketAddr,
    /// Also answer portmapper queries on `portmap_port` of the listen address.
    pub portmap: bool,
    pub portmap_port: u16,
    /// Where the file-handle key lives; handles stay valid as long as it does.
    pub state_dir: Option<PathBuf>,
    /// A directory on a memory file system (tmpfs) for the live duplicate request journal,
    /// which the state directory's copy follows (`rpc::drc`). Unset: `/run/nasd` where
    /// `/run` is one, else `$XDG_RUNTIME_DIR/nasd`, else `/dev/shm/nasd-UID`. Elsewhere
    /// (or if none is found) the journal is written to the state directory alone.
    pub runtime_dir: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    pub metrics: Option<SocketAddr>,
    /// exports(5) file.
    pub exports: Option<PathBuf>,
    /// How long to poll a busy connection for its next request before sleeping (0: never).
    pub busy_poll_us: u64,
    /// TCP congestion control for NFS and MOUNT connections (`TCP_CONGESTION`, e.g.
    /// "cubic"). Unset: the system's default (`net.ipv4.tcp_congestion_control`), or an
    /// unpaced one for connections from this host where that default paces
    /// (`congestion::Policy`).
    pub tcp_congestion: Option<String>,
    pub limits: Limits,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    pub max_connections: usize,
    /// Requests one connection may have in flight (read but not yet answered).
    pub max_requests_per_connection: usize,
    /// Requests in flight across all connections; bounds memory.
    pub max_requests_in_flight: usize,
    pub max_record_bytes: usize,
    /// Replies kept for retransmitted non-idempotent calls.
    pub drc_entries: usize,
    /// Open file objects cached per export.
    pub open_objects: usize,
    /// Close a cached object nobody has used for this long (0: only when the cache is
    /// full), so that files others delete or replace free their disk space.
    pub open_object_idle_secs: u64,
    /// Close a connection that sends nothing for this long.
    pub idle_timeout_secs: u64,
    /// Close a connection whose replies cannot be sent for this long, or whose request,
    /// once started, takes longer than this to arrive. Also how long a stop waits for
    /// calls still running.
    pub write_timeout_secs: u64,
    /// While requests wait for a free slot: close a connection stalled this long with
    /// slots, its replies not taken or its request not arriving (see `server::stalls`;
    /// 0: never, leaving such connections to the write timeout).
    pub stall_timeout_secs: u64,
    /// At start, after an earlier process was killed while changes it had answered were
    /// becoming durable: how long to wait for the file systems' sync before serving
    /// anyway. Answers whose exports were not made durable by then are dropped (their
    /// calls run again when resent).
    pub start_sync_timeout_secs: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:2049".parse().expect("valid"),
            portmap: false,
            portmap_port: 111,
            state_dir: None,
            runtime_dir: None,
            metrics: None,
            exports: None,
            busy_poll_us: 50,
            tcp_congestion: None,
            limits: Limits::default(),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            max_requests_per_connection: 128,
            max_requests_in_flight: 512,
            max_record_bytes: 1024 * 1024 + 64 * 1024,
            drc_entries: 8192,
            open_objects: 8192,
            open_object_idle_secs: 10,
            idle_timeout_secs: 360,
            write_timeout_secs: 60,
            stall_timeout_secs: 5,
            start_sync_timeout_secs: 60,
        }
    }
}

/// The largest call: a WRITE of the largest size FSINFO offers (`wtmax`), with its RPC
/// header, credential and arguments.
pub const LARGEST_CALL: usize = crate::nfs3::xdr::MAX_IO as usize + 4096;

impl Limits {
    /// Refuses limits a client could not work with: FSINFO offers 1 MiB WRITEs, and a
    /// record longer than `max_record_bytes` closes the connection, so a smaller limit
    /// would make the Linux client retransmit the same WRITE forever.
    ///
    /// Refuses zeros where they mean nothing useful: no call ever admitted, every
    /// connection closed at once, a cache of no replies. The two limits where 0 means
    /// something (`stall_timeout_secs`: never; `open_object_idle_secs`: only when full)
    /// take it.
    ///
    /// Refuses values too large to mean anything but a mistake, which would otherwise
    /// overflow where they are used (a semaphore's permits, a count of nanoseconds).
    pub fn check(&self) -> Result<(), String> {
        for (name, value) in [
            ("max_connections", self.max_connections as u64),
            ("max_requests_per_connection", self.max_requests_per_connection as u64),
            ("max_requests_in_flight", self.max_requests_in_flight as u64),
            ("drc_entries", self.drc_entries as u64),
            ("idle_timeout_secs", self.idle_timeout_secs),
            ("write_timeout_secs", self.write_timeout_secs),
            ("start_sync_timeout_secs", self.start_sync_timeout_secs),
        ] {
            if value == 0 {
                return Err(format!("{name} = 0 is refused: it must be at least 1"));
            }
        }
        let counts = [
            ("max_connections", self.max_connections),
            ("max_requests_per_connection", self.max_requests_per_connection),
            ("max_requests_in_flight", self.max_requests_in_flight),
            ("drc_entries", self.drc_entries),
            ("open_objects", self.open_objects),
        ];
        let seconds = [
            ("open_object_idle_secs", self.open_object_idle_secs),
            ("idle_timeout_secs", self.idle_timeout_secs),
            ("write_timeout_secs", self.write_timeout_secs),
            ("stall_timeout_secs", self.stall_timeout_secs),
            // Not `start_sync_timeout_secs`: its deadline is added with `checked_add`, and
            // the largest value is how a test asks for no bound at all.
        ];
        let too_large = counts
            .iter()
            .map(|&(name, v)| (name, v as u64, COUNT_MAX))
            .chain(seconds.iter().map(|&(name, v)| (name, v, SECONDS_MAX)))
            .chain([("max_record_bytes", self.max_record_bytes as u64, RECORD_MAX)])
            .find(|&(_, value, max)| value > max);
        if let Some((name, value, max)) = too_large {
            return Err(format!("{name} = {value} is refused: it must be at most {max}"));
        }
        if self.max_record_bytes < LARGEST_CALL {
            return Err(format!(
                "max_record_bytes = {} is too small: a 1 MiB WRITE (the size nasd offers clients) needs {LARGEST_CALL}",
                self.max_record_bytes
            ));
        }
        Ok(())
    }
}

/// Largest count limit taken (connections, requests, cache entries).
const COUNT_MAX: u64 = 1 << 24;
/// Largest time limit taken, in seconds (about 68 years).
const SECONDS_MAX: u64 = 1 << 31;
/// Largest record limit taken: each connection may buffer a record this long.
const RECORD_MAX: u64 = 1 << 30;
/// Longest busy poll taken, in microseconds: a worker thread spins this long per busy
/// connection, holding off the other connections' tasks on it.
const BUSY_POLL_MAX_US: u64 = 1000;
/// The kernel's limit on a congestion control name, its terminating NUL included.
const TCP_CA_NAME_MAX: usize = 16;

impl Config {
    pub fn from_toml(text: &str) -> Result<Config, toml::de::Error> {
        toml::from_str(text)
    }

    /// [`Limits::check`], a busy poll no longer than [`BUSY_POLL_MAX_US`], and a
    /// congestion control name the kernel could take (whether it has that algorithm is
    /// found out when the server starts).
    pub fn check(&self) -> Result<(), String> {
        if self.busy_poll_us > BUSY_POLL_MAX_US {
            return Err(format!("busy_poll_us = {} is refused: it must be at most {BUSY_POLL_MAX_US}", self.busy_poll_us));
        }
        if let Some(name) = &self.tcp_congestion {
            let well_formed = !name.is_empty()
                && name.len() < TCP_CA_NAME_MAX
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !well_formed {
                return Err(format!(
                    "tcp_congestion = {name:?} is refused: it must be the name of a congestion control algorithm (letters, digits, '_' or '-', at most {} characters)",
                    TCP_CA_NAME_MAX - 1
                ));
            }
        }
        self.limits.check()
    }

    pub fn state_dir(&self) -> PathBuf {
        if let Some(d) = &self.state_dir {
            return d.clone();
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            return PathBuf::from("/var/lib/nasd");
        }
        let base = std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
            .unwrap_or_else(|| PathBuf::from("."));
        base.join("nasd")
    }

    /// Where the live duplicate request journal goes: the `runtime_dir` set, or the first
    /// of its defaults on a memory file system; `None` where there is none. The caller
    /// checks a directory that was set.
    pub fn runtime_dir(&self) -> Option<PathBuf> {
        if let Some(d) = &self.runtime_dir {
            return Some(d.clone());
        }
        let run = std::path::Path::new("/run");
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        if uid == 0 && crate::fh::on_memory_file_system(run) {
            return Some(run.join("nasd"));
        }
        if let Some(xdg) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
            if crate::fh::on_memory_file_system(&xdg) {
                return Some(xdg.join("nasd"));
            }
        }
        let shm = std::path::Path::new("/dev/shm");
        crate::fh::on_memory_file_system(shm).then(|| shm.join(format!("nasd-{uid}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_that_would_stop_the_server_are_refused_and_zero_timeouts_that_mean_never_are_not() {
        for name in [
            "max_connections",
            "max_requests_per_connection",
            "max_requests_in_flight",
            "drc_entries",
            "idle_timeout_secs",
            "write_timeout_secs",
            "start_sync_timeout_secs",
        ] {
            let config = Config::from_toml(&format!("[limits]\n{name} = 0\n")).expect("parses");
            let refused = config.limits.check().expect_err(name);
            assert!(refused.starts_with(&format!("{name} = 0")), "{refused}");
        }
        let config = Config::from_toml("[limits]\nstall_timeout_secs = 0\nopen_object_idle_secs = 0\n").expect("parses");
        assert_eq!(config.limits.check(), Ok(()));
        assert_eq!(Limits::default().check(), Ok(()));
    }

    #[test]
    fn limits_too_large_to_be_meant_are_refused_before_they_overflow() {
        // Each one past its bound: a semaphore's permits (panics above usize::MAX >> 3),
        // a connection's `u32` permits, seconds counted in `u64` nanoseconds.
        for (line, name) in [
            ("[limits]\nmax_requests_in_flight = 4611686018427387904", "max_requests_in_flight"),
            ("[limits]\nmax_requests_per_connection = 4294967296", "max_requests_per_connection"),
            ("[limits]\nmax_connections = 16777217", "max_connections"),
            ("[limits]\ndrc_entries = 16777217", "drc_entries"),
            ("[limits]\nopen_objects = 16777217", "open_objects"),
            ("[limits]\nstall_timeout_secs = 18446744074", "stall_timeout_secs"),
            ("[limits]\nidle_timeout_secs = 2147483649", "idle_timeout_secs"),
            ("[limits]\nmax_record_bytes = 1073741825", "max_record_bytes"),
            ("busy_poll_us = 1000001", "busy_poll_us"),
        ] {
            let config = Config::from_toml(line).expect("parses");
            let refused = config.check().expect_err(name);
            assert!(refused.starts_with(&format!("{name} = ")) && refused.contains("at most"), "{refused}");
        }
        let at_bounds = "busy_poll_us = 1000\n[limits]\nmax_requests_in_flight = 16777216\nstall_timeout_secs = 2147483648\nmax_record_bytes = 1073741824\nstart_sync_timeout_secs = 9223372036854775807\n";
        assert_eq!(Config::from_toml(at_bounds).expect("parses").check(), Ok(()));
    }

    #[test]
    fn a_record_limit_below_the_largest_write_is_refused() {
        assert!(Limits::default().check().is_ok());
        let c = Config::from_toml("[limits]\nmax_record_bytes = 262144\n").unwrap();
        let err = c.limits.check().unwrap_err();
        assert!(err.contains("max_record_bytes = 262144"), "{err}");
        let c = Config::from_toml(&format!("[limits]\nmax_record_bytes = {LARGEST_CALL}\n")).unwrap();
        assert!(c.limits.check().is_ok());
    }

    #[test]
    fn toml_overrides_defaults_and_rejects_unknown_keys() {
        let c = Config::from_toml("listen = \"0.0.0.0:2050\"\nportmap = true\n[limits]\ndrc_entries = 10\n").unwrap();
        assert_eq!(c.listen.port(), 2050);
        assert!(c.portmap);
        assert_eq!(c.limits.drc_entries, 10);
        assert_eq!(c.limits.max_requests_per_connection, 128);
        assert!(Config::from_toml("lisen = \"x\"").is_err());
    }

    #[test]
    fn a_congestion_control_name_the_kernel_could_not_take_is_refused() {
        for bad in ["", "cubic reno", "a/b", "sixteen_letters_"] {
            let config = Config { tcp_congestion: Some(bad.into()), ..Config::default() };
            let refused = config.check().expect_err(bad);
            assert!(refused.starts_with("tcp_congestion = "), "{refused}");
        }
        let config = Config::from_toml("tcp_congestion = \"cubic\"").expect("parses");
        assert_eq!(config.tcp_congestion.as_deref(), Some("cubic"));
        assert_eq!(config.check(), Ok(()));
    }
}
