#!/usr/bin/env bash
# Sets up a fresh machine and runs the demo: a Pika cluster's life (create, add a shard, remove one, switch a master)
# on loopback, with pika-action run exactly as KubeBlocks would run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --locked --bins -p pika-action -p testbed
exec target/debug/demo target/debug/pika-action
