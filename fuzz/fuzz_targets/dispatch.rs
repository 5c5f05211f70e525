//! The whole request path below the transport: Dispatcher::handle with NFSv3, MOUNT and
//! portmap over a LocalFs export of a temporary directory.
//!
//! Input: up to 8 records, each a big-endian u16 length then that many bytes. In every
//! record the XDR opaque `00 00 00 04 "ROOT"` is replaced by the export's root file
//! handle and the opaque `00 00 00 06 "EXPORT" 00 00` by the export's path, so the
//! fuzzer (and the seeds made from captured traffic) reach past MOUNT and handle
//! verification into the procedures.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nasd::backend::local::{creds, ChangeCount, LocalConfig, LocalFs};
use nasd::exports::parse_exports;
use nasd::fh::HandleKey;
use nasd::metrics::Metrics;
use nasd::mount3::Mount3;
use nasd::nfs3::Nfs3;
use nasd::portmap::Portmap;
use nasd::rpc::dispatch::{Dispatcher, Handled};
use nasd::rpc::{RpcProgram, Transport};
use nasd::server::state::{ExportRuntime, ServerState};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

const ROOT_TOKEN: &[u8] = b"\0\0\0\x04ROOT";
const EXPORT_TOKEN: &[u8] = b"\0\0\0\x06EXPORT\0\0";

struct World {
    dispatcher: Dispatcher,
    root_opaque: Vec<u8>,
    export_opaque: Vec<u8>,
    _dir: tempfile::TempDir,
}

static EXPORT_DIR: OnceLock<std::path::PathBuf> = OnceLock::new();

/// libFuzzer leaves through exit(), which runs no destructors: remove the export here.
extern "C" fn remove_export() {
    if let Some(p) = EXPORT_DIR.get() {
        let _ = std::fs::remove_dir_all(p);
    }
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        creds::init();
        let dir = tempfile::Builder::new().prefix("nasd-fuzz-").tempdir().expect("tempdir");
        EXPORT_DIR.set(dir.path().to_path_buf()).expect("once");
        unsafe { libc::atexit(remove_export) };
        std::fs::write(dir.path().join("file"), b"hello, world\n").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let text = format!("{} 127.0.0.1(rw,no_root_squash,async,insecure)\n", dir.path().display());
        let table = parse_exports(&text, "fuzz").expect("exports");
        let mut metrics = Metrics::new();
        metrics.register(nasd::nfs3::xdr::PROGRAM, "nfs3", &nasd::nfs3::xdr::proc::NAMES);
        metrics.register(nasd::mount3::PROGRAM, "mount3", &nasd::mount3::proc::NAMES);
        let metrics = Arc::new(metrics);
        let mut exports = Vec::new();
        for export in table.exports {
            let vfs = LocalFs::open(&LocalConfig {
                path: export.path.clone(),
                fsid: export.id as u64,
                sync: false,
                cache_capacity: 64,
                cache_idle: None,
                changes: ChangeCount::default(),
            })
            .expect("open export");
            let root = vfs.root_identity();
            exports.push(ExportRuntime { export, vfs, root });
        }
        let state = Arc::new(ServerState::new(exports, HandleKey::from_bytes([7; 32]), metrics.clone()));
        let rt = state.exports()[0].clone();
        let root = rt.vfs.root();
        let fh = state.file_handle(&rt, &root);
        let mut root_opaque = (fh.len() as u32).to_be_bytes().to_vec();
        root_opaque.extend_from_slice(&fh);
        root_opaque.resize(4 + fh.len().div_ceil(4) * 4, 0);
        let path = dir.path().as_os_str().as_encoded_bytes();
        let mut export_opaque = (path.len() as u32).to_be_bytes().to_vec();
        export_opaque.extend_from_slice(path);
        export_opaque.resize(4 + path.len().div_ceil(4) * 4, 0);
        let programs: Vec<Arc<dyn RpcProgram>> = vec![
            Arc::new(Nfs3::new(state.clone())),
            Arc::new(Mount3::new(state.clone())),
            Arc::new(Portmap::new(state.nfs_port.clone(), 2049)),
        ];
        World { dispatcher: Dispatcher::new(programs, 256, metrics), root_opaque, export_opaque, _dir: dir }
    })
}

fn substitute(rec: &[u8], w: &World) -> Vec<u8> {
    let mut out = Vec::with_capacity(rec.len() + w.root_opaque.len());
    let mut i = 0;
    while i < rec.len() {
        if rec[i..].starts_with(ROOT_TOKEN) {
            out.extend_from_slice(&w.root_opaque);
            i += ROOT_TOKEN.len();
        } else if rec[i..].starts_with(EXPORT_TOKEN) {
            out.extend_from_slice(&w.export_opaque);
            i += EXPORT_TOKEN.len();
        } else {
            out.push(rec[i]);
            i += 1;
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let peer: SocketAddr = "127.0.0.1:700".parse().unwrap();
    let local: SocketAddr = "127.0.0.1:2049".parse().unwrap();
    let mut rest = data;
    for _ in 0..8 {
        let [a, b, tail @ ..] = rest else { break };
        let n = (u16::from_be_bytes([*a, *b]) as usize).min(tail.len());
        let rec = substitute(&tail[..n], w);
        rest = &tail[n..];
        // As the TCP transport does: on the network thread first, on a worker if it must wait.
        let reply = match w.dispatcher.try_handle_inline(&rec, peer, local, Transport::Tcp) {
            Handled::Done(reply) => reply,
            Handled::NeedsThread => w.dispatcher.handle(&rec, peer, local, Transport::Tcp),
        };
        if let Some(reply) = reply {
            assert!(reply.bytes.len() >= 4);
            let mark = u32::from_be_bytes(reply.bytes[..4].try_into().unwrap());
            assert_eq!((mark & 0x7fff_ffff) as usize, reply.len() - 4);
        }
    }
});
