#!/usr/bin/env bash
# Runs every test of the workspace: unit tests, the integration tests that drive the real pika-action binary over
# real etcd, real redis-servers and the Codis double, and the transcript conformance test of the double.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo test --workspace --all-features --locked
