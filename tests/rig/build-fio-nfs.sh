#!/bin/sh
# Prebuild the test rig's client tools into the test cache
# ($NASD_TEST_CACHE or <repo>/target/test-cache):
#   * fio with the libnfs ioengine (from Debian's fio source package)
#   * the nfsh libnfs helper
# Safe to run concurrently and repeatedly (cached by recipe hash, file-locked).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
python3 -m rig.fio "$@"
if [ -f rig/nfsh.py ]; then
    python3 -m rig.nfsh
fi
