#!/usr/bin/env bash
# The suite on fresh clones beside two CPU hogs (issue 41): clone this repository at COMMIT into a temporary
# directory, run `CI=true bash .ci/run` there while two `yes > /dev/null` run, RUNS times in a row, stopping at the
# first failure. Prints one line per run (exit status, seconds) and the pytest summaries; logs stay in the clones.
#
# Usage: scripts/ci_beside_hogs.sh [COMMIT] [RUNS]     (defaults: HEAD, 3)
set -u
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
commit=$(git -C "$repo" rev-parse --short "${1:-HEAD}")
runs=${2:-3}
for run in $(seq 1 "$runs"); do
  dir=$(mktemp -d "/tmp/ci_hogs_${commit}_${run}_XXXX")
  git clone -q "$repo" "$dir" && git -C "$dir" checkout -q "$commit" || exit 1
  yes > /dev/null & h1=$!
  yes > /dev/null & h2=$!
  start=$(date +%s)
  (cd "$dir" && CI=true bash .ci/run > "$dir/ci.log" 2>&1)
  rc=$?
  kill "$h1" "$h2" 2>/dev/null
  echo "run $run of $runs, commit $commit: exit $rc in $(( $(date +%s) - start )) s (log: $dir/ci.log)"
  grep -E "(passed|failed).* in [0-9.]+s" "$dir/ci.log" | tail -3
  [ "$rc" -eq 0 ] || exit "$rc"
done
