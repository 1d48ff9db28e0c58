#!/usr/bin/env bash
# The whole suite N times in a row (default 3) with two busy processes beside it, as on a loaded CI machine:
# timing-dependent tests show up as failures here. Each run is `CI=true bash .ci/run` on a fresh clone of HEAD
# (with ../shared beside it), so it also proves the clone builds from nothing but caches outside it.
# Usage: tools/stress-suite.sh [RUNS] [WORKDIR]   (prints one line per run: its status, wall time, pytest's summary)
set -uo pipefail
runs="${1:-3}"
work="${2:-/tmp/qp-stress}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
shared="$(cd "$repo/../shared" 2>/dev/null && pwd || true)"
busy() { python3 -c 'while True: pass' & }
busy; b1=$!; busy; b2=$!
trap 'kill "$b1" "$b2" 2>/dev/null' EXIT
for run in $(seq 1 "$runs"); do
    # a clone still in use (an earlier run killed half-way) must not be reused: stop instead
    rm -rf "$work" && mkdir -p "$work" && git clone -q "$repo" "$work/clone" || { echo "run $run: cannot make a fresh clone in $work"; exit 1; }
    [ -n "$shared" ] && ln -sfn "$shared" "$work/shared"
    start=$(date +%s)
    (cd "$work/clone" && CI=true bash .ci/run) > "$work/../qp-stress-run$run.log" 2>&1
    status=$?
    summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed)|[0-9]+ (passed|failed).* in ' "$work/../qp-stress-run$run.log" | tail -1)
    echo "run $run: exit $status, $(( $(date +%s) - start )) s wall, $summary"
done
