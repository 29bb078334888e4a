#!/bin/sh
# Runs the libFuzzer harnesses built by `make fuzz-build` (BUILD/fuzz/fuzz_*), each with its
# checked-in seed corpus tests/fuzz/corpus/<name>/ and a scratch corpus BUILD/fuzz-corpus/<name>/
# (new inputs go there, never into the checked-in seeds). Crashes are saved in
# BUILD/fuzz-artifacts/<name>/ and fail the run.
#
#   scripts/fuzz.sh run BUILD SECONDS       fuzz each harness for SECONDS; print executions and
#                                            coverage (libFuzzer's cov and ft) per harness
#   scripts/fuzz.sh regress BUILD SECONDS   replay every checked-in corpus file once (no
#                                            fuzzing), then a short run of SECONDS per harness
set -eu
mode=${1:?usage: fuzz.sh run|regress BUILD SECONDS}
build=${2:?usage: fuzz.sh run|regress BUILD SECONDS}
seconds=${3:?usage: fuzz.sh run|regress BUILD SECONDS}
cd "$(dirname "$0")/.."

bins=$(ls "$build"/fuzz/fuzz_* 2>/dev/null || true)
[ -n "$bins" ] || { echo "fuzz: no harness in $build/fuzz (make fuzz-build)" >&2; exit 1; }

failed=""
# The last status line of a libFuzzer log: "#N <event> cov: C ft: F corp: U/S ..."
summary() {
    log=$1
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    line=$(grep -E '^#[0-9]+.*cov: [0-9]+ ft: [0-9]+' "$log" | tail -n 1)
    cov=$(echo "$line" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
    ft=$(echo "$line" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
    corp=$(echo "$line" | sed -n 's/.* corp: \([0-9]*\/[0-9A-Za-z]*\).*/\1/p')
    printf '%-14s %12s %9s %7s %7s %12s\n' "$2" "${execs:-?}" "${speed:-?}" "${cov:-?}" \
        "${ft:-?}" "${corp:-?}"
}

fuzz_one() {
    bin=$1 secs=$2
    name=$(basename "$bin" | sed 's/^fuzz_//')
    seeds=tests/fuzz/corpus/$name
    work=$build/fuzz-corpus/$name
    arts=$build/fuzz-artifacts/$name
    log=$build/fuzz-logs/$name.log
    mkdir -p "$seeds" "$work" "$arts" "$build/fuzz-logs"
    # -timeout: one input over 10 s is a hang; -rss_limit_mb bounds a leak; -max_len lets a
    # whole configuration file through.
    if "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
        -print_final_stats=1 -artifact_prefix="$arts/" "$work" "$seeds" >"$log" 2>&1; then
        summary "$log" "$name"
    else
        summary "$log" "$name"
        echo "fuzz: $name FAILED (log $log, inputs in $arts/):" >&2
        grep -E 'ERROR: |runtime error|fuzz property broken|SUMMARY' "$log" | head -n 5 >&2
        failed="$failed $name"
    fi
}

replay_one() {
    bin=$1
    name=$(basename "$bin" | sed 's/^fuzz_//')
    seeds=tests/fuzz/corpus/$name
    log=$build/fuzz-logs/$name.replay.log
    mkdir -p "$build/fuzz-logs"
    files=$(find "$seeds" -type f | sort)
    [ -n "$files" ] || { echo "fuzz: $name has no seed corpus ($seeds)" >&2; failed="$failed $name"; return; }
    n=$(echo "$files" | wc -l)
    # shellcheck disable=SC2086
    if "$bin" -timeout=10 -rss_limit_mb=2048 $files >"$log" 2>&1; then
        printf '%-14s %5d corpus files replayed, no report\n' "$name" "$n"
    else
        echo "fuzz: $name corpus replay FAILED (log $log):" >&2
        grep -E 'Running: |ERROR: |runtime error|fuzz property broken|SUMMARY' "$log" | tail -n 6 >&2
        failed="$failed $name"
    fi
}

case $mode in
run)
    echo "fuzz: ${seconds} s per harness ($(date -u +%Y-%m-%d))"
    printf '%-14s %12s %9s %7s %7s %12s\n' harness executions exec/s cov ft corpus
    for b in $bins; do fuzz_one "$b" "$seconds"; done
    ;;
regress)
    for b in $bins; do replay_one "$b"; done
    printf '%-14s %12s %9s %7s %7s %12s\n' "short run" executions exec/s cov ft corpus
    for b in $bins; do fuzz_one "$b" "$seconds"; done
    ;;
*)
    echo "usage: fuzz.sh run|regress BUILD SECONDS" >&2
    exit 2
    ;;
esac
if [ -n "$failed" ]; then
    echo "fuzz: failed:$failed" >&2
    exit 1
fi
