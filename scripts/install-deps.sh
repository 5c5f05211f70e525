#!/usr/bin/env bash
# Installs what building nasd and running its whole test suite needs on Debian 12:
# the real NFS clients and peers the tests drive (libnfs, the Linux kernel client in a
# qemu guest, fio's libnfs engine, NFS-Ganesha), and build tools.
set -euo pipefail

# --build: only what building nasd needs (a C compiler for blake3, a Rust toolchain, and
# the CA certificates cargo needs to fetch crates).
build_only=false
[ "${1:-}" = "--build" ] && build_only=true

packages=(
  build-essential pkg-config dpkg-dev       # fio and the libnfs helper are built from source
  ca-certificates                           # cargo fetches crates over TLS
  libnfs-utils libnfs-dev                   # userspace NFS client tools and library
  qemu-system-x86 debootstrap e2fsprogs     # the kernel-client guest
  iproute2 kmod                             # network namespaces for the guest
  nfs-ganesha nfs-ganesha-vfs rpcbind       # the peer server
  fonts-dejavu-core                         # text in benchmark plots
  strace procps
  nfs-common                                # showmount, for the MOUNT protocol checks
  python3 python3-pytest                    # the test runner
)
$build_only && packages=(build-essential ca-certificates)

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: run as root (apt-get, network namespaces and the guest need it)" >&2
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! $build_only; then
  # Debian starts ganesha when it is installed; the tests start their own instances.
  systemctl stop nfs-ganesha 2>/dev/null || true
  pkill -x ganesha.nfsd 2>/dev/null || true
fi

if ! command -v cargo >/dev/null; then
  # Debian 12's own recent toolchain (its plain `rustc` is too old for the dependencies).
  echo "install-deps: no cargo; installing Debian's rustc-web and cargo-web"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends rustc-web cargo-web >/dev/null
fi
$build_only && exit 0
# A python3 ahead of Debian's on PATH (a pyenv, a venv) needs pytest of its own.
if ! python3 -c 'import pytest' 2>/dev/null; then
  python3 -m pip install --quiet pytest
fi
