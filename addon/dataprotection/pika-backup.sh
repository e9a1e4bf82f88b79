#!/bin/bash
# Full backup of one pika: BGSAVE (a consistent RocksDB checkpoint under dump-path), then the dump directory as one
# tar stream into the backup repository with datasafed. Runs in a Job on the pod's node with the pod's data volume
# mounted at DATA_DIR; talks to pika over RESP with bash's /dev/tcp (the pika image has no redis-cli).
set -euo pipefail

data_dir="${DATA_DIR:-/data}"
conf="$data_dir/pika.conf"
host="${DP_DB_HOST:?DP_DB_HOST is required}"
port="${DP_DB_PORT:-9221}"
name="${DP_BACKUP_NAME:?DP_BACKUP_NAME is required}"
datasafed="${DATASAFED:-datasafed}"
wait_seconds="${BGSAVE_WAIT_SECONDS:-3600}"

# conf_value KEY: a setting of the persisted pika.conf ("key : value").
conf_value() {
  awk -F':' -v key="$1" '{ k = $1; gsub(/[ \t]/, "", k) } k == key { v = substr($0, index($0, ":") + 1); gsub(/^[ \t]+|[ \t\r]+$/, "", v); print v; exit }' "$conf"
}

# resp ARGS...: sends one command (after AUTH when pika has a password) and prints the reply's first line.
resp() {
  local password
  password=$(conf_value requirepass)
  exec 3<>"/dev/tcp/$host/$port"
  if [ -n "$password" ]; then
    printf '*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n' "${#password}" "$password" >&3
    local auth
    IFS= read -r auth <&3
    case "$auth" in +*) ;; *) exec 3>&-; echo "pika-backup: AUTH failed: ${auth%$'\r'}" >&2; return 1 ;; esac
  fi
  local cmd="*$#\r\n" arg
  for arg in "$@"; do cmd="$cmd\$${#arg}\r\n$arg\r\n"; done
  printf '%b' "$cmd" >&3
  local reply line
  IFS= read -r reply <&3
  reply="${reply%$'\r'}"
  if [ "${reply:0:1}" = '$' ] && [ "${reply:1}" != "-1" ]; then
    # A bulk string (INFO): read it whole.
    local size="${reply:1}" body=""
    while [ "${#body}" -lt "$size" ] && IFS= read -r line <&3; do body="$body$line"$'\n'; done
    reply="$body"
  fi
  exec 3>&-
  printf '%s\n' "$reply"
}

dump_path=$(conf_value dump-path)
dump_path="${dump_path:-$data_dir/dump/}"
before=$(ls -1 "$dump_path" 2>/dev/null || true)

reply=$(resp BGSAVE)
case "$reply" in -*) echo "pika-backup: BGSAVE refused: $reply" >&2; exit 1 ;; esac
echo "pika-backup: BGSAVE started: $reply"

# Wait for the dump. (The reply is read whole first: with pipefail, `resp | grep -q` could end the wait early.)
deadline=$((SECONDS + wait_seconds))
while :; do
  info=$(resp INFO stats)
  case "$info" in *"is_bgsaving:Yes"*) ;; *) break ;; esac
  [ "$SECONDS" -lt "$deadline" ] || { echo "pika-backup: BGSAVE still running after ${wait_seconds}s" >&2; exit 1; }
  sleep 2
done

dump=$(ls -1t "$dump_path" | head -n 1)
if [ -z "$dump" ] || [ ! -d "$dump_path/$dump" ]; then
  echo "pika-backup: no dump directory in $dump_path after BGSAVE (before: ${before:-none})" >&2
  exit 1
fi
echo "pika-backup: pushing $dump_path$dump as $name.tar"
tar -cf - -C "$dump_path" "$dump" | "$datasafed" push - "/$name.tar"
rm -rf "${dump_path:?}/$dump"
echo "pika-backup: done"
