#!/usr/bin/env bash
# Runs every cargo-fuzz target, one at a time, from its seeds (fuzz/seeds/<target>) and
# its local corpus (fuzz/corpus/<target>, not committed). Skips cleanly when cargo-fuzz
# is not installed. Exit status: non-zero if any target crashed, leaked or timed out.
#
#   fuzz/run-short.sh                    # each target ~20 s (CI)
#   FUZZ_SECONDS=60 fuzz/run-short.sh rpc_call nfs3_args
#   FUZZ_RUNS=10000000 fuzz/run-short.sh # the long runs recorded in docs/reliability.md
#
# Crash inputs land in fuzz/artifacts/<target>/; reproduce with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run -O <target> fuzz/artifacts/<target>/<file>
set -uo pipefail
cd "$(dirname "$0")"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: cargo-fuzz not installed (cargo install cargo-fuzz); skipping"
    exit 0
fi
# cargo-fuzz passes -Z flags; this lets the stable toolchain accept them.
export RUSTC_BOOTSTRAP=1
# A distribution's rustc (Debian's rustc-web) ships no AddressSanitizer runtime: fuzz
# without it there, where a panic is still a crash found.
sanitizer=()
if ! ls "$("${RUSTC:-rustc}" --print sysroot)"/lib/rustlib/*/lib/librustc-*_rt.asan.a >/dev/null 2>&1; then
    echo "fuzz: this Rust toolchain has no AddressSanitizer runtime; fuzzing without a sanitizer"
    sanitizer=(-s none)
fi

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(rpc_record rpc_call nfs3_args mount3_args portmap_args dispatch file_handle exports_file)
if [ -n "${FUZZ_RUNS:-}" ]; then
    limit=(-runs="$FUZZ_RUNS")
else
    limit=(-max_total_time="${FUZZ_SECONDS:-20}")
fi

cargo fuzz build -O "${sanitizer[@]}" >/dev/null 2>&1 || cargo fuzz build -O "${sanitizer[@]}" || exit 1

status=0
mkdir -p logs
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    start=$(date +%s)
    # -rss_limit_mb bounds the process (AddressSanitizer included); -malloc_limit_mb
    # fails any single allocation above 64 MiB: no decoder may allocate that much.
    cargo fuzz run -O "${sanitizer[@]}" "$t" "corpus/$t" "seeds/$t" -- "${limit[@]}" \
        -rss_limit_mb=2048 -malloc_limit_mb=64 -timeout=10 -print_final_stats=1 \
        >"logs/$t.log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "logs/$t.log" | grep -o '[0-9]*$' | tail -1)
    rss=$(grep -o 'stat::peak_rss_mb: *[0-9]*' "logs/$t.log" | grep -o '[0-9]*$' | tail -1)
    printf 'fuzz %-13s rc=%d execs=%s seconds=%s peak_rss_mb=%s\n' "$t" "$rc" "${execs:-?}" "$secs" "${rss:-?}"
    if [ $rc -ne 0 ]; then
        status=1
        grep -E 'panicked|ERROR|SUMMARY|Test unit written' "logs/$t.log" | head -20
    fi
done
exit $status
