#!/usr/bin/env bash
# Installs the dependencies, builds nasd and runs every test: unit tests, protocol and
# hostile-input tests, libnfs and kernel-client integration tests, and the bench smoke.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

echo "== format (rustfmt.toml)"
if cargo fmt --version >/dev/null 2>&1; then
  cargo fmt --check && (cd fuzz && cargo fmt --check)
else
  echo "skipped: this toolchain has no rustfmt (cargo fmt), so the format cannot be checked"
fi

echo "== lints (clippy; warnings fail the run)"
if cargo clippy --version >/dev/null 2>&1; then
  cargo clippy --release --locked --all-targets -- -D warnings && (cd fuzz && cargo clippy --locked -- -D warnings)
else
  echo "skipped: this toolchain has no clippy, so the lints cannot be checked"
fi

echo "== build"
cargo build --release --locked

echo "== unit tests"
cargo test --release --locked 2>&1 | tee target/cargo-test.log

echo "== fuzz (every decoder target briefly; docs/reliability.md has the long runs)"
command -v cargo-fuzz >/dev/null || cargo install --locked --quiet cargo-fuzz
FUZZ_SECONDS="${FUZZ_SECONDS:-10}" bash fuzz/run-short.sh

echo "== test rig (fio with libnfs, nfsh, kernel-client guest image)"
(cd tests && python3 -m rig.fio >/dev/null && python3 -m rig.nfsh >/dev/null)
(cd tests && python3 -c 'from rig import vm; print("guest image:", vm.ensure_image().rootfs)')

echo "== integration tests (real clients)"
python3 -m pytest -p no:cacheprovider -ra tests "$@"
