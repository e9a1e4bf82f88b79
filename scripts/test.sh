#!/usr/bin/env bash
# Runs every test of the workspace with cargo nextest (.config/nextest.toml: one process per test, every test binary
# in one queue, two at a time, the longest first): unit tests, the integration tests that drive the real pika-action
# binary over real etcd, real pika and the fork (and, where a test says why, redis-server and the Codis double), the
# transcript conformance test of the double, the chart tests; then the doc tests (cargo test --doc).
# The reliability suite (actions/tests/integration/reliability_*.rs, real_pika/crash.rs, actions/tests/failpoints/
# crash_*.rs) records what it counted under <target>/tmp/reliability; the tables are printed at the end whatever the
# outcome: trials (attacks on a running system checked against Codis, pika and etcd state), checks (runs of the binary
# whose exit and output were checked), proptest cases and fuzz inputs, each on its own. The script fails when any
# test failed, when any category recorded a failure, when a fail-point test module (feature `failpoints`) recorded
# nothing, or when `cargo fmt --check` or `cargo clippy --all-targets --all-features -- -D warnings` finds anything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
reliability="${CARGO_TARGET_DIR:-target}/tmp/reliability"
rm -rf "$reliability"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo nextest run --workspace --all-features --locked --no-fail-fast 2>&1 | tee "$log" || status=$?
cargo test --workspace --all-features --locked --doc 2>&1 | tee -a "$log" || status=$?

echo
# nextest's summary: "Summary [ <s>] <n> tests run: <p> passed[ (<k> slow)][, <f> failed], <i> skipped" (skipped:
# the ignored tests, as no filter is given).
summary="$(grep -a "^ *Summary \[" "$log" | tail -1 || true)"
count() { grep -oE "[0-9]+ $1" <<<"$summary" | grep -oE "^[0-9]+" || echo 0; }
echo "tests: $(count passed) passed, $(count failed) failed, $(count skipped) ignored (${summary##*Summary })"
failed='^ +(FAIL|SIGKILL|SIGSEGV|SIGABRT|SIGTERM|TIMEOUT|LEAK-FAIL) \['
if grep -qaE "$failed" "$log"; then
  echo "failed tests:"
  grep -aE "$failed" "$log" | sed -E 's/^ +[A-Z-]+ \[[^]]*\] (\([^)]*\) )?/  /' | sort -u
fi
if [ -z "$summary" ]; then
  echo "cargo nextest printed no summary: the tests did not run" >&2
  status=1
fi

if compgen -G "$reliability/*.jsonl" >/dev/null; then
  echo
  cat "$reliability"/*.jsonl | awk '
    match($0, /"kind": "[^"]*"/) { k = substr($0, RSTART + 9, RLENGTH - 10) }
    match($0, /"category": "[^"]*"/) { c = substr($0, RSTART + 13, RLENGTH - 14) }
    match($0, /"count": [0-9]+/) { n[k SUBSEP c] += substr($0, RSTART + 9, RLENGTH - 9) }
    match($0, /"failures": [0-9]+/) { f[k SUBSEP c] += substr($0, RSTART + 12, RLENGTH - 12) }
    END {
      kinds[1] = "trial"; kinds[2] = "check"; kinds[3] = "proptest case"; kinds[4] = "fuzz input"
      for (o = 1; o <= 4; o++) {
        kind = kinds[o]; m = 0; delete keys
        for (key in n) { split(key, parts, SUBSEP); if (parts[1] == kind) keys[++m] = parts[2] }
        if (m == 0) continue
        for (i = 2; i <= m; i++) { v = keys[i]; for (j = i - 1; j > 0 && keys[j] > v; j--) keys[j + 1] = keys[j]; keys[j + 1] = v }
        printf "%-66s %8s %9s\n", kind "s (per category)", "count", "failures"
        tt = 0; ff = 0
        for (i = 1; i <= m; i++) { key = kind SUBSEP keys[i]; printf "  %-64s %8d %9d\n", keys[i], n[key], f[key]; tt += n[key]; ff += f[key] }
        printf "  %-64s %8d %9d\n\n", "total " kind "s", tt, ff
        all += ff
      }
      exit all > 0
    }' || status=1
fi

# Without --all-features the fail-point tests are skipped (required-features); here every one of their modules must
# have run and recorded its crash points.
for module in actions/tests/failpoints/crash_*.rs; do
  crash="$(basename "$module" .rs)"
  if ! compgen -G "$reliability/$crash-*.jsonl" >/dev/null; then
    echo "the fail-point test $crash did not run (or recorded nothing)" >&2
    status=1
  fi
done
# The real-pika crash tests (actions/tests/integration/real_pika/crash.rs) run in the integration binary, gated on
# the same feature.
if ! compgen -G "$reliability/crash-*.jsonl" >/dev/null; then
  echo "the real-pika fail-point test real_pika/crash.rs did not run (or recorded nothing)" >&2
  status=1
fi
echo
if ! cargo fmt --all --check >/dev/null; then
  echo "cargo fmt --check: the tree is not formatted (run cargo fmt --all)" >&2
  status=1
else
  echo "cargo fmt --check: clean"
fi
if ! cargo clippy --workspace --all-targets --all-features --locked -- -D warnings; then
  echo "cargo clippy -D warnings: warnings above" >&2
  status=1
else
  echo "cargo clippy --all-targets --all-features -D warnings: clean"
fi
exit "$status"
