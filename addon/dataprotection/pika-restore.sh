#!/bin/bash
# Restore of one pika from a full backup, before pika first starts on the new volume: the BGSAVE dump becomes the
# database directory (db-path). Runs in a Job with the new pod's data volume at DATA_DIR.
set -euo pipefail

data_dir="${DATA_DIR:-/data}"
name="${DP_BACKUP_NAME:?DP_BACKUP_NAME is required}"
datasafed="${DATASAFED:-datasafed}"
db_path="$data_dir/db"
work="$data_dir/.restore"

if [ -d "$db_path" ] && [ -n "$(ls -A "$db_path")" ]; then
  echo "pika-restore: $db_path is not empty; refusing to overwrite it" >&2
  exit 1
fi
rm -rf "$work"
mkdir -p "$work" "$db_path"
"$datasafed" pull "/$name.tar" - | tar -xf - -C "$work"
# The tar holds one dump directory (<dump-prefix><date>) with one directory per database (db0, ...).
dump=$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -n 1)
if [ -z "$dump" ] || [ -z "$(ls -A "$dump")" ]; then
  echo "pika-restore: $name.tar holds no dump directory" >&2
  exit 1
fi
for db in "$dump"/*; do
  [ -d "$db" ] && mv "$db" "$db_path/"
done
rm -rf "$work"
echo "pika-restore: restored $name into $db_path"
