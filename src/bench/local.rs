//! The local disk's own figures for the same job shapes: the ceiling an NFS server over
//! that disk can approach. fio with direct I/O on the file system of the report, and
//! metadata operations with plain system calls.

use super::fio;
use anyhow::{bail, Result};
use std::path::Path;
use std::time::Instant;

/// The fio engine for local direct I/O: the first of libaio, io_uring, posixaio and psync
/// that this fio has and that works here (io_uring may be refused by a sandbox).
pub fn pick_engine(fio_bin: &Path, dir: &Path) -> String {
    let have = fio::engines(fio_bin);
    std::fs::create_dir_all(dir).ok();
    for e in ["libaio", "io_uring", "posixaio"] {
        if !have.iter().any(|h| h == e) {
            continue;
        }
        let probe = dir.join("engine-probe.dat");
        let args: Vec<String> = vec![
            "--output-format=json".into(),
            "--name=probe".into(),
            format!("--ioengine={e}"),
            "--direct=1".into(),
            "--rw=randwrite".into(),
            "--bs=4k".into(),
            "--iodepth=4".into(),
            "--size=1m".into(),
            format!("--filename={}", probe.display()),
        ];
        let ok = fio::run(fio_bin, &args, fio::Deadlines::size_based(60)).is_ok();
        let _ = std::fs::remove_file(&probe);
        if ok {
            return e.to_string();
        }
    }
    "psync".into()
}

/// Local metadata operation over `files` files in `dirs` directories below `root`.
/// Returns (operations, seconds).
pub fn meta(root: &Path, op: super::suites::MetaOp, files: u32, dirs: u32) -> Result<(u64, f64)> {
    use super::suites::MetaOp::*;
    let flat = root.join("md-flat");
    let name = |i: u32| flat.join(format!("f{i:08}"));
    let t0 = Instant::now();
    let ops: u64 = match op {
        Tree => {
            let tree = root.join("md-tree");
            let _ = std::fs::remove_dir_all(&tree);
            std::fs::create_dir_all(&tree)?;
            let per = (files / dirs.max(1)).max(1);
            let t0 = Instant::now();
            for d in 0..dirs {
                let dp = tree.join(format!("d{d:05}"));
                std::fs::create_dir(&dp)?;
                for f in 0..per {
                    std::fs::File::create(dp.join(format!("f{f:08}")))?;
                }
            }
            let secs = t0.elapsed().as_secs_f64();
            let _ = std::fs::remove_dir_all(&tree);
            return Ok(((dirs * (per + 1)) as u64, secs));
        }
        Create => {
            let _ = std::fs::remove_dir_all(&flat);
            std::fs::create_dir_all(&flat)?;
            let t0 = Instant::now();
            for i in 0..files {
                std::fs::File::create(name(i))?;
            }
            return Ok((files as u64, t0.elapsed().as_secs_f64()));
        }
        Stat => {
            for i in 0..files {
                std::fs::metadata(name(i))?;
            }
            files as u64
        }
        Readdir => {
            let n = std::fs::read_dir(&flat)?.count() as u64;
            if n != files as u64 {
                bail!("readdir found {n} entries, expected {files}");
            }
            n
        }
        Remove => {
            for i in 0..files {
                std::fs::remove_file(name(i))?;
            }
            files as u64
        }
    };
    Ok((ops, t0.elapsed().as_secs_f64()))
}
