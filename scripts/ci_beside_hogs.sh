#!/usr/bin/env bash
# The suite on fresh clones beside two CPU hogs (issue 41): clone this repository at COMMIT into a temporary
# directory, run `CI=true bash .ci/run` there while HOGS `yes > /dev/null` run (default 2), RUNS times in a row,
# stopping at the first failure. Prints one line per run (exit status, seconds, load average) and the pytest
# summaries; logs stay in the clones. HOGS=1 beside another CPU-bound job of one thread counts as two hogs.
#
# Usage: [HOGS=N] scripts/ci_beside_hogs.sh [COMMIT] [RUNS]     (defaults: HEAD, 3)
set -u
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
commit=$(git -C "$repo" rev-parse --short "${1:-HEAD}")
runs=${2:-3}
hogs=${HOGS:-2}
for run in $(seq 1 "$runs"); do
  dir=$(mktemp -d "/tmp/ci_hogs_${commit}_${run}_XXXX")
  git clone -q "$repo" "$dir" && git -C "$dir" checkout -q "$commit" || exit 1
  pids=()
  for _ in $(seq 1 "$hogs"); do yes > /dev/null & pids+=($!); done
  start=$(date +%s)
  (cd "$dir" && CI=true bash .ci/run > "$dir/ci.log" 2>&1)
  rc=$?
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  kill "${pids[@]}" 2>/dev/null
  echo "run $run of $runs, commit $commit, $hogs yes hogs: exit $rc in $(( $(date +%s) - start )) s, load average at the end $load (log: $dir/ci.log)"
  grep -E "(passed|failed).* in [0-9.]+s" "$dir/ci.log" | tail -3
  [ "$rc" -eq 0 ] || exit "$rc"
done
