#!/usr/bin/env bash
# Runs every test of the workspace: unit tests, the integration tests that drive the real pika-action binary over
# real etcd, real redis-servers and the Codis double, and the transcript conformance test of the double.
# The reliability suite (actions/tests/reliability_*.rs, crash_*.rs) records its trials under
# <target>/tmp/reliability; their table is printed at the end, whatever the outcome, without changing the exit status.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
reliability="${CARGO_TARGET_DIR:-target}/tmp/reliability"
rm -rf "$reliability"
status=0
cargo test --workspace --all-features --locked || status=$?
if compgen -G "$reliability/*.jsonl" >/dev/null; then
  echo
  echo "reliability summary (trials and failures per category)"
  cat "$reliability"/*.jsonl | awk '
    match($0, /"category": "[^"]*"/) { c = substr($0, RSTART + 13, RLENGTH - 14) }
    match($0, /"trials": [0-9]+/) { t[c] += substr($0, RSTART + 10, RLENGTH - 10) }
    match($0, /"failures": [0-9]+/) { f[c] += substr($0, RSTART + 12, RLENGTH - 12) }
    END {
      printf "%-62s %8s %9s\n", "category", "trials", "failures"
      n = 0; for (k in t) keys[++n] = k
      for (i = 2; i <= n; i++) { v = keys[i]; for (j = i - 1; j > 0 && keys[j] > v; j--) keys[j + 1] = keys[j]; keys[j + 1] = v }
      for (i = 1; i <= n; i++) { printf "%-62s %8d %9d\n", keys[i], t[keys[i]], f[keys[i]]; tt += t[keys[i]]; ff += f[keys[i]] }
      printf "%-62s %8d %9d\n", "total", tt, ff
    }' || true
fi
exit "$status"
