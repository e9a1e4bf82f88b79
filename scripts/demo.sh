#!/usr/bin/env bash
# Sets up a fresh machine and runs the demo: a Pika cluster's life (create, write, add a shard, remove one, switch a
# master over, kill a master and watch the failover) on the servers the chart ships (real pika v4.0.1, Pika's Codis
# fork, etcd), with pika-action run as KubeBlocks would run it. Works wherever cargo puts its output
# (CARGO_TARGET_DIR); leaves no process, network namespace or file behind. Needs root (network namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --locked --bin pika-action -p pika-action
# The demo finds pika-action beside itself: both are built into the same target directory.
exec cargo run --locked --quiet --bin demo -p testbed
