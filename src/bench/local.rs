//! The local disk's own figures for the same job shapes: the ceiling an NFS server over
//! that disk can approach. fio with direct I/O on the file system of the report, and
//! metadata operations with plain system calls.

use super::fio;
use super::suites::MetaOp;
use crate::backend::local::DurableCalls;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::path::{Path, PathBuf};
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

/// The parallel form of `meta` for create and remove: `clients` threads at once, each on
/// `per` files in its own directory `root/md-par/cN`. Returns (operations, seconds from
/// the first thread's start to the last one's end), the span nfsh clients are timed by.
/// With `durable`, each change is made durable before the next, as a `sync` export does.
pub fn meta_parallel(root: &Path, op: MetaOp, per: u32, clients: u32, durable: Option<&DurableCalls>) -> Result<(u64, f64)> {
    let par = root.join("md-par");
    let dirs: Vec<PathBuf> = (0..clients).map(|c| par.join(format!("c{c}"))).collect();
    if op == MetaOp::Create {
        let _ = std::fs::remove_dir_all(&par);
        for d in &dirs {
            std::fs::create_dir_all(d)?;
        }
    } else if op != MetaOp::Remove {
        bail!("{op:?} has no parallel form");
    }
    let start = std::sync::Barrier::new(dirs.len());
    let spans = std::thread::scope(|s| {
        let threads: Vec<_> = dirs
            .iter()
            .map(|d| {
                let start = &start;
                s.spawn(move || -> Result<(Instant, Instant)> {
                    let dir = File::open(d)?;
                    start.wait();
                    let t0 = Instant::now();
                    for i in 0..per {
                        let f = d.join(format!("f{i:08}"));
                        if op == MetaOp::Create {
                            File::create(&f)?;
                        } else {
                            std::fs::remove_file(&f)?;
                        }
                        entries_changed(durable, &dir)?;
                    }
                    Ok((t0, Instant::now()))
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().map_err(|_| anyhow::anyhow!("a local metadata thread panicked"))?).collect::<Result<Vec<_>>>()
    })?;
    let (Some(first_start), Some(last_end)) = (spans.iter().map(|s| s.0).min(), spans.iter().map(|s| s.1).max()) else {
        bail!("no clients");
    };
    Ok((per as u64 * clients as u64, (last_end - first_start).as_secs_f64()))
}

/// After a change to `dir`'s entries: nothing, or what a `sync` export does.
fn entries_changed(durable: Option<&DurableCalls>, dir: &File) -> Result<()> {
    if let Some(calls) = durable {
        calls.entries_changed(&[dir])?;
    }
    Ok(())
}

/// Local metadata operation over `files` files in `dirs` directories below `root`.
/// With `durable`, each change is made durable before the next, as a `sync` export does.
/// Returns (operations, seconds).
pub fn meta(root: &Path, op: MetaOp, files: u32, dirs: u32, durable: Option<&DurableCalls>) -> Result<(u64, f64)> {
    use MetaOp::*;
    let flat = root.join("md-flat");
    let name = |i: u32| flat.join(format!("f{i:08}"));
    let renamed = |i: u32| flat.join(format!("r{i:08}"));
    let open_flat = || File::open(&flat).with_context(|| format!("opening {}", flat.display()));
    let t0 = Instant::now();
    let ops: u64 = match op {
        Tree => {
            let tree = root.join("md-tree");
            let _ = std::fs::remove_dir_all(&tree);
            std::fs::create_dir_all(&tree)?;
            let top = File::open(&tree)?;
            let per = (files / dirs.max(1)).max(1);
            let t0 = Instant::now();
            for d in 0..dirs {
                let dp = tree.join(format!("d{d:05}"));
                std::fs::create_dir(&dp)?;
                entries_changed(durable, &top)?;
                let dir = File::open(&dp)?;
                for f in 0..per {
                    File::create(dp.join(format!("f{f:08}")))?;
                    entries_changed(durable, &dir)?;
                }
            }
            // The tree stays until the bench's data goes: removing it here would slow the
            // creates that follow (`suites::run_order`).
            return Ok(((dirs * (per + 1)) as u64, t0.elapsed().as_secs_f64()));
        }
        Create => {
            let _ = std::fs::remove_dir_all(&flat);
            std::fs::create_dir_all(&flat)?;
            let dir = open_flat()?;
            let t0 = Instant::now();
            for i in 0..files {
                File::create(name(i))?;
                entries_changed(durable, &dir)?;
            }
            return Ok((files as u64, t0.elapsed().as_secs_f64()));
        }
        Stat => {
            for i in 0..files {
                std::fs::metadata(name(i))?;
            }
            files as u64
        }
        RoundTrip => {
            let file = File::open(name(0)).with_context(|| format!("opening {}", name(0).display()))?;
            for _ in 0..files {
                file.metadata()?;
            }
            files as u64
        }
        Rename => {
            let dir = open_flat()?;
            let t0 = Instant::now();
            for i in 0..files {
                std::fs::rename(name(i), renamed(i))?;
                entries_changed(durable, &dir)?;
            }
            return Ok((files as u64, t0.elapsed().as_secs_f64()));
        }
        Readdir | Relist => {
            let listings = if op == Relist { super::suites::RELISTINGS } else { 1 };
            for _ in 0..listings {
                let n = std::fs::read_dir(&flat)?.count() as u64;
                if n != files as u64 {
                    bail!("readdir found {n} entries, expected {files}");
                }
            }
            files as u64 * listings as u64
        }
        Remove => {
            let dir = open_flat()?;
            let t0 = Instant::now();
            for i in 0..files {
                std::fs::remove_file(renamed(i))?;
                entries_changed(durable, &dir)?;
            }
            return Ok((files as u64, t0.elapsed().as_secs_f64()));
        }
        Untar | CopyTree | RemoveTree => bail!("{op:?} is a real-tree job: local::tree"),
    };
    Ok((ops, t0.elapsed().as_secs_f64()))
}

/// What a tree holds (the top directory counts as one directory).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TreeStats {
    pub files: u64,
    pub dirs: u64,
    pub links: u64,
    /// Bytes of the regular files.
    pub bytes: u64,
}

impl TreeStats {
    /// Operations of an untar, copy or removal: one per file, directory and symlink.
    pub fn ops(&self) -> u64 {
        self.files + self.dirs + self.links
    }

    pub fn describe(&self) -> String {
        format!("{} files, {} directories, {} symlinks, {:.1} MiB", self.files, self.dirs, self.links, self.bytes as f64 / 1048576.0)
    }
}

/// Copy the tree `src` to `dst` (which must not exist) like `cp -r`: directories, regular
/// files with their content and permissions, symlinks as symlinks; other file types and
/// directories whose name `skip` accepts are left out. With `durable`, as nfsh put-tree
/// through a `sync` export: each directory, file and symlink made durable once created,
/// and each file's data once written (its COMMIT); files then get put-tree's mode,
/// (mode & 0o777) | 0o600.
pub fn copy_tree(src: &Path, dst: &Path, skip: &dyn Fn(&str) -> bool, durable: Option<&DurableCalls>) -> Result<TreeStats> {
    let mut st = TreeStats::default();
    let parent = durable.map(|_| open_parent(dst)).transpose()?;
    copy_tree_into(src, dst, skip, &mut st, durable.zip(parent.as_ref()))?;
    Ok(st)
}

fn open_parent(path: &Path) -> Result<File> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    File::open(parent).with_context(|| format!("opening {}", parent.display()))
}

/// `durable`: the calls, and the directory `dst` is made in.
fn copy_tree_into(
    src: &Path,
    dst: &Path,
    skip: &dyn Fn(&str) -> bool,
    st: &mut TreeStats,
    durable: Option<(&DurableCalls, &File)>,
) -> Result<()> {
    std::fs::create_dir(dst).with_context(|| format!("mkdir {}", dst.display()))?;
    let here = match durable {
        Some((calls, parent)) => {
            calls.entries_changed(&[parent])?;
            Some((calls, File::open(dst).with_context(|| format!("opening {}", dst.display()))?))
        }
        None => None,
    };
    let durable_here = here.as_ref().map(|(calls, dir)| (*calls, dir));
    st.dirs += 1;
    for e in std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let e = e?;
        let ft = e.file_type()?;
        let to = dst.join(e.file_name());
        if ft.is_dir() {
            if !skip(&e.file_name().to_string_lossy()) {
                copy_tree_into(&e.path(), &to, skip, st, durable_here)?;
            }
        } else if ft.is_file() {
            st.bytes += match durable_here {
                None => std::fs::copy(e.path(), &to).with_context(|| format!("copying {}", e.path().display()))?,
                Some((calls, dir)) => copy_file_durably(&e.path(), &to, calls, dir)?,
            };
            st.files += 1;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(e.path())?, &to)?;
            if let Some((calls, dir)) = durable_here {
                calls.entries_changed(&[dir])?;
            }
            st.links += 1;
        }
    }
    Ok(())
}

/// Create `to` in `dir` (durable), copy `from` into it, then make its data durable.
fn copy_file_durably(from: &Path, to: &Path, calls: &DurableCalls, dir: &File) -> Result<u64> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut src = File::open(from).with_context(|| format!("opening {}", from.display()))?;
    let mode = src.metadata()?.permissions().mode();
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode((mode & 0o777) | 0o600)
        .open(to)
        .with_context(|| format!("creating {}", to.display()))?;
    calls.entries_changed(&[dir])?;
    let n = std::io::copy(&mut src, &mut out).with_context(|| format!("copying {}", from.display()))?;
    if n > 0 {
        calls.data_written(&out)?;
    }
    Ok(n)
}

/// `rm -rf` of `dir`, in `parent`, as nfsh remove-tree through a `sync` export: one entry
/// at a time, each removal durable before the next.
fn remove_tree_durably(dir: &Path, parent: &File, calls: &DurableCalls) -> Result<()> {
    let here = File::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    // Listed whole before the removals, as nfsh does.
    let entries = std::fs::read_dir(dir)?.collect::<std::io::Result<Vec<_>>>()?;
    for e in entries {
        if e.file_type()?.is_dir() {
            remove_tree_durably(&e.path(), &here, calls)?;
        } else {
            std::fs::remove_file(e.path()).with_context(|| format!("removing {}", e.path().display()))?;
            calls.entries_changed(&[&here])?;
        }
    }
    std::fs::remove_dir(dir).with_context(|| format!("removing {}", dir.display()))?;
    calls.entries_changed(&[parent])?;
    Ok(())
}

/// Count what a tree holds (symlinks not followed; other file types not counted).
pub fn count_tree(dir: &Path) -> Result<TreeStats> {
    let mut st = TreeStats { dirs: 1, ..Default::default() };
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let ft = e.file_type()?;
        if ft.is_dir() {
            let s = count_tree(&e.path())?;
            st.files += s.files;
            st.dirs += s.dirs;
            st.links += s.links;
            st.bytes += s.bytes;
        } else if ft.is_file() {
            st.files += 1;
            st.bytes += e.metadata()?.len();
        } else if ft.is_symlink() {
            st.links += 1;
        }
    }
    Ok(st)
}

/// The source tree of the real-tree jobs, copied once per run (the copy is not timed).
#[derive(Clone, Debug)]
pub struct TreeSource {
    /// What it is, for the report.
    pub what: String,
    /// The copy the jobs read (below the report directory).
    pub path: PathBuf,
    pub stats: TreeStats,
}

/// Directories left out of Python's standard library: byte code, third-party packages
/// (they differ from machine to machine) and the static libraries of `config-*`.
pub fn stdlib_skip(name: &str) -> bool {
    name == "__pycache__" || name == "site-packages" || name == "dist-packages" || name.starts_with("config-")
}

/// Copy the source tree to `dst`: `$NASD_BENCH_TREE` when set, else the standard library
/// of the `python3` on the PATH; either without [`stdlib_skip`] directories.
pub fn prepare_tree_source(dst: &Path) -> Result<TreeSource> {
    const SKIPPED: &str = "without __pycache__, site-packages, dist-packages and config-* directories";
    let (origin, what) = match std::env::var_os("NASD_BENCH_TREE") {
        Some(p) => (PathBuf::from(p), format!("the tree of $NASD_BENCH_TREE {SKIPPED}")),
        None => {
            let o = std::process::Command::new("python3")
                .args(["-c", "import sysconfig, sys; print(sysconfig.get_paths()['stdlib']); print(sys.version.split()[0])"])
                .output()
                .context("running python3 to find its standard library")?;
            if !o.status.success() {
                bail!("python3 -c 'import sysconfig ...' failed: {}", String::from_utf8_lossy(&o.stderr));
            }
            let out = String::from_utf8_lossy(&o.stdout).to_string();
            let mut l = out.lines();
            let (dir, ver) = (l.next().unwrap_or(""), l.next().unwrap_or("?"));
            // Named by version, not by path: where it lives is the machine's business.
            (PathBuf::from(dir), format!("the standard library of the python3 on the PATH (Python {ver}) {SKIPPED}"))
        }
    };
    if !origin.is_dir() {
        bail!("source tree {} is not a directory", origin.display());
    }
    let _ = std::fs::remove_dir_all(dst);
    let stats =
        copy_tree(&origin, dst, &stdlib_skip, None).with_context(|| format!("copying {} to {}", origin.display(), dst.display()))?;
    Ok(TreeSource { what, path: dst.to_path_buf(), stats })
}

/// The real-tree jobs on the local file system, below `root`: untar = copy `src` to
/// tree-untar, cp -r = copy tree-untar to tree-copy, rm -rf = remove tree-untar (then,
/// not timed, tree-copy). With `durable`, each change is made durable as a `sync` export
/// makes it ([`copy_tree`]). Returns what was handled and the timed seconds.
pub fn tree(root: &Path, op: MetaOp, src: &Path, durable: Option<&DurableCalls>) -> Result<(TreeStats, f64)> {
    let (untar, copy) = (root.join("tree-untar"), root.join("tree-copy"));
    let none = |_: &str| false;
    match op {
        MetaOp::Untar => {
            let _ = std::fs::remove_dir_all(&untar);
            let t0 = Instant::now();
            let st = copy_tree(src, &untar, &none, durable)?;
            Ok((st, t0.elapsed().as_secs_f64()))
        }
        MetaOp::CopyTree => {
            let _ = std::fs::remove_dir_all(&copy);
            let t0 = Instant::now();
            let st = copy_tree(&untar, &copy, &none, durable)?;
            Ok((st, t0.elapsed().as_secs_f64()))
        }
        MetaOp::RemoveTree => {
            let st = count_tree(&untar)?;
            let parent = durable.map(|_| open_parent(&untar)).transpose()?;
            let t0 = Instant::now();
            match durable.zip(parent.as_ref()) {
                Some((calls, parent)) => remove_tree_durably(&untar, parent, calls)?,
                None => std::fs::remove_dir_all(&untar)?,
            }
            let secs = t0.elapsed().as_secs_f64();
            let _ = std::fs::remove_dir_all(&copy);
            Ok((st, secs))
        }
        other => bail!("{other:?} is not a real-tree job"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dir: &Path) {
        std::fs::create_dir_all(dir.join("pkg/sub")).unwrap();
        std::fs::create_dir_all(dir.join("pkg/__pycache__")).unwrap();
        std::fs::write(dir.join("a.py"), b"print(1)\n").unwrap();
        std::fs::write(dir.join("pkg/__init__.py"), b"").unwrap();
        std::fs::write(dir.join("pkg/sub/m.py"), vec![7u8; 100_000]).unwrap();
        std::fs::write(dir.join("pkg/__pycache__/m.pyc"), b"x").unwrap();
        std::os::unix::fs::symlink("../a.py", dir.join("pkg/link.py")).unwrap();
        std::os::unix::fs::symlink("/nonexistent", dir.join("dangling")).unwrap();
    }

    #[test]
    fn copy_count_and_remove_a_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        sample(&src);
        let all = count_tree(&src).unwrap();
        assert_eq!(all, TreeStats { files: 4, dirs: 4, links: 2, bytes: 9 + 100_000 + 1 });

        // the source copy leaves __pycache__ out and keeps symlinks as they are
        let copy = tmp.path().join("tree-src");
        let st = copy_tree(&src, &copy, &stdlib_skip, None).unwrap();
        assert_eq!(st, TreeStats { files: 3, dirs: 3, links: 2, bytes: 9 + 100_000 });
        assert_eq!(st.ops(), 8);
        assert_eq!(count_tree(&copy).unwrap(), st);
        assert!(!copy.join("pkg/__pycache__").exists());
        assert_eq!(std::fs::read_link(copy.join("dangling")).unwrap(), Path::new("/nonexistent"));
        assert_eq!(std::fs::read(copy.join("pkg/sub/m.py")).unwrap(), vec![7u8; 100_000]);

        // untar, cp -r, rm -rf on the local disk; then again with each change durable, as a
        // sync export makes it: one call per entry made or removed, one per file with data
        let (made, with_data) = (st.ops(), 2);
        for durable in [false, true] {
            let root = tmp.path().join(if durable { "durable" } else { "plain" });
            std::fs::create_dir(&root).unwrap();
            let calls = DurableCalls::for_dir(&root).unwrap();
            let calls = durable.then_some(&calls);
            let (u, _) = tree(&root, MetaOp::Untar, &copy, calls).unwrap();
            assert_eq!(u, st);
            assert_eq!(calls.map(|c| c.made()), durable.then_some((made, with_data)));
            let (c, _) = tree(&root, MetaOp::CopyTree, &copy, calls).unwrap();
            assert_eq!(c, st);
            assert_eq!(count_tree(&root.join("tree-copy")).unwrap(), st);
            assert_eq!(std::fs::read(root.join("tree-copy/pkg/sub/m.py")).unwrap(), vec![7u8; 100_000]);
            assert_eq!(std::fs::read_link(root.join("tree-copy/pkg/link.py")).unwrap(), Path::new("../a.py"));
            assert_eq!(calls.map(|c| c.made()), durable.then_some((2 * made, 2 * with_data)));
            let (r, secs) = tree(&root, MetaOp::RemoveTree, &copy, calls).unwrap();
            assert_eq!(r, st);
            assert!(secs >= 0.0);
            assert!(!root.join("tree-untar").exists() && !root.join("tree-copy").exists());
            assert_eq!(calls.map(|c| c.made()), durable.then_some((3 * made, 2 * with_data)));
            assert!(tree(&root, MetaOp::Stat, &copy, calls).is_err());
        }
        // put-tree's mode: the source's, readable and writable by the owner
        use std::os::unix::fs::PermissionsExt;
        let root = tmp.path().join("modes");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(copy.join("a.py"), std::fs::Permissions::from_mode(0o444)).unwrap();
        let calls = DurableCalls::for_dir(&root).unwrap();
        tree(&root, MetaOp::Untar, &copy, Some(&calls)).unwrap();
        let mode = std::fs::metadata(root.join("tree-untar/a.py")).unwrap().permissions().mode();
        assert_eq!(mode & 0o600, 0o600, "{mode:o}");
        assert_eq!(mode & 0o133, 0, "{mode:o}");
    }

    #[test]
    fn stdlib_skip_leaves_out_bytecode_and_third_party() {
        for d in ["__pycache__", "site-packages", "dist-packages", "config-3.11-x86_64-linux-gnu"] {
            assert!(stdlib_skip(d), "{d}");
        }
        for d in ["asyncio", "test", "lib-dynload", "email", "configparser"] {
            assert!(!stdlib_skip(d), "{d}");
        }
    }

    #[test]
    fn loops_rename_then_remove_the_renamed_files() {
        let tmp = tempfile::tempdir().unwrap();
        for durable in [false, true] {
            let root = &tmp.path().join(if durable { "durable" } else { "plain" });
            std::fs::create_dir(root).unwrap();
            let calls = DurableCalls::for_dir(root).unwrap();
            let calls = durable.then_some(&calls);
            for op in [MetaOp::Create, MetaOp::Stat, MetaOp::RoundTrip, MetaOp::Rename] {
                assert_eq!(meta(root, op, 30, 3, calls).unwrap().0, 30, "{op:?}");
            }
            assert!(root.join("md-flat/r00000029").exists() && !root.join("md-flat/f00000000").exists());
            assert_eq!(meta(root, MetaOp::Readdir, 30, 3, calls).unwrap().0, 30);
            // every listing's entries count
            assert_eq!(meta(root, MetaOp::Relist, 30, 3, calls).unwrap().0, 30 * super::super::suites::RELISTINGS as u64);
            assert_eq!(meta(root, MetaOp::Remove, 30, 3, calls).unwrap().0, 30);
            assert_eq!(std::fs::read_dir(root.join("md-flat")).unwrap().count(), 0);
            assert!(meta(root, MetaOp::Untar, 30, 3, calls).is_err());
            // a durable call per create, rename and remove; none for stat and readdir
            assert_eq!(calls.map(|c| c.made()), durable.then_some((90, 0)));
            // the tree job: 3 directories of 10 files
            assert_eq!(meta(root, MetaOp::Tree, 30, 3, calls).unwrap().0, 33);
            assert_eq!(calls.map(|c| c.made()), durable.then_some((123, 0)));
        }
    }

    #[test]
    fn parallel_loops_create_and_remove_in_a_directory_per_client() {
        let tmp = tempfile::tempdir().unwrap();
        for durable in [false, true] {
            let root = &tmp.path().join(if durable { "durable" } else { "plain" });
            std::fs::create_dir(root).unwrap();
            let calls = DurableCalls::for_dir(root).unwrap();
            let calls = durable.then_some(&calls);
            assert_eq!(meta_parallel(root, MetaOp::Create, 20, 3, calls).unwrap().0, 60);
            for c in 0..3 {
                let dir = root.join(format!("md-par/c{c}"));
                assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 20, "{dir:?}");
                assert!(dir.join("f00000019").exists());
            }
            assert_eq!(meta_parallel(root, MetaOp::Remove, 20, 3, calls).unwrap().0, 60);
            for c in 0..3 {
                assert_eq!(std::fs::read_dir(root.join(format!("md-par/c{c}"))).unwrap().count(), 0);
            }
            assert_eq!(calls.map(|c| c.made()), durable.then_some((120, 0)));
            // removing files that are gone is an error, not a figure
            assert!(meta_parallel(root, MetaOp::Remove, 20, 3, calls).is_err());
            assert!(meta_parallel(root, MetaOp::Stat, 20, 3, calls).is_err());
        }
    }
}
