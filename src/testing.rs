//! Helpers for unit tests.

/// Says why a test cannot check anything here and lets it return; under CI (`CI` set),
/// where the machine is set up for every test, fails it instead, so that a check that did
/// not run cannot pass for one that did.
pub fn skip(reason: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("cannot run under CI, where every test must run: {reason}");
    }
    eprintln!("skipped: {reason}");
}

/// Writes an executable script at `path` from a child process. Written by this process,
/// the file would be open for writing in any child another test thread forks before it is
/// closed, and executing it while such a child lives fails with ETXTBSY.
pub fn write_executable(path: &std::path::Path, script: &str) {
    use std::io::Write;
    let mut writer = std::process::Command::new("sh")
        .args(["-c", "cat > \"$0\" && chmod 755 \"$0\""])
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("start sh to write a script");
    writer.stdin.take().expect("piped stdin").write_all(script.as_bytes()).expect("hand sh the script");
    assert!(writer.wait().expect("wait for sh").success(), "sh could not write {}", path.display());
}
