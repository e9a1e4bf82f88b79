#!/bin/sh
# The pika container's start-up. Three steps, each needed before pika serves a client:
#   1. merge KubeBlocks' settings into the persisted pika.conf on the data volume;
#   2. `pika-action rejoin`: if Codis lists this pod in a group whose master is another pod, point the persisted
#      `slaveof` at that master, so that a restarted or rescheduled pod never comes back as a second master; if
#      Codis still lists this pod as the master, hand mastership to the most advanced live replica first (or refuse
#      to start an empty master over a group that held data);
#   3. exec pika on the persisted file.
#
# The persisted file is pika's own (CONFIG REWRITE writes slaveof, replication-id and run-id there) and survives
# restarts. The template (KubeBlocks' rendered config, one "key value" per line) owns every setting it names, so a
# Reconfiguring OpsRequest takes effect at the next start; pika owns its replication state; the password is
# PIKA_PASSWORD (requirepass = masterauth = Codis product_auth).
#
# pika v4.0.1 has a second account, "limit" (password `userpass`, minus the commands of `userblacklist`). With
# `userpass` empty that account takes any password: `AUTH <anything>` answers +OK and the client may then SET,
# SLAVEOF and CONFIG GET requirepass. So `userpass` is a random secret made at the first start, known to nobody,
# and the chart's `userblacklist` takes the administrative commands from the account besides: PIKA_PASSWORD alone
# opens pika.
set -eu

template="${PIKA_CONFIG_TEMPLATE:-/etc/pika/pika.conf}"
config="${PIKA_CONFIG_FILE:-/data/pika.conf}"
action="${PIKA_ACTION:-/tools/pika-action}"
pika="${PIKA_BIN:-/pika/bin/pika}"

# merge_config TEMPLATE CONFIG: rewrites CONFIG ("key : value") with TEMPLATE's settings, in place.
merge_config() {
  [ -f "$2" ] || : >"$2"
  awk -v template="$1" '
    function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t\r]+$/, "", s); return s }
    BEGIN {
      # Written by pika itself; a template must not reset them.
      owned["slaveof"] = 1; owned["replication-id"] = 1; owned["run-id"] = 1
      owned["master-run-id"] = 1; owned["internal-used-unfinished-full-sync"] = 1
      n = 0
      set["requirepass"] = ENVIRON["PIKA_PASSWORD"]; order[++n] = "requirepass"
      set["masterauth"] = ENVIRON["PIKA_PASSWORD"]; order[++n] = "masterauth"
      set["userpass"] = ENVIRON["PIKA_USERPASS"]; order[++n] = "userpass"
      while ((getline line < template) > 0) {
        line = trim(line)
        if (line == "" || line ~ /^#/) continue
        key = line
        sub(/[ \t].*$/, "", key)
        if ((key in owned) || (key in set)) continue
        set[key] = trim(substr(line, length(key) + 1))
        order[++n] = key
      }
      close(template)
    }
    {
      line = trim($0)
      if (line != "" && line !~ /^#/ && index(line, ":") > 0) {
        key = trim(substr(line, 1, index(line, ":") - 1))
        if (key in set) { print key " : " set[key]; done[key] = 1; next }
      }
      print $0
    }
    END {
      for (i = 1; i <= n; i++) if (!(order[i] in done)) print order[i] " : " set[order[i]]
    }
  ' "$2" >"$2.tmp"
  mv "$2.tmp" "$2"
}

if [ ! -r "$template" ]; then
  echo "pika-start: no config template at $template" >&2
  exit 2
fi
# The account's secret is made once per volume (a restart changes nothing in the persisted file).
PIKA_USERPASS="$(sed -n 's/^[[:space:]]*userpass[[:space:]]*:[[:space:]]*\([^[:space:]]*\)[[:space:]]*$/\1/p' "$config" 2>/dev/null | tail -n 1)"
[ -n "$PIKA_USERPASS" ] || PIKA_USERPASS="$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
export PIKA_USERPASS
merge_config "$template" "$config"
unset PIKA_USERPASS
echo "pika-start: $config merged from $template"

# pika needs maxclients + 5000 open files (PIKA_MIN_RESERVED_FDS: RocksDB, binlogs, replication) and aborts at start
# when the container's hard open-file limit is lower: it may raise its soft limit, not the hard one. Container
# runtimes differ in that limit, so maxclients is lowered to what fits instead of leaving the pod in a crash loop.
reserved=5000
hard="$(ulimit -Hn)"
if [ "$hard" != "unlimited" ]; then
  maxclients="$(sed -n 's/^[[:space:]]*maxclients[[:space:]]*:[[:space:]]*\([0-9][0-9]*\)[[:space:]]*$/\1/p' "$config" | tail -n 1)"
  maxclients="${maxclients:-20000}"
  if [ $((maxclients + reserved)) -gt "$hard" ]; then
    fits=$((hard - reserved))
    if [ "$fits" -lt 100 ]; then
      echo "pika-start: the open-file limit ($hard) leaves too few connections beside the $reserved files pika reserves" >&2
      exit 2
    fi
    sed "s/^[[:space:]]*maxclients[[:space:]]*:.*/maxclients : $fits/" "$config" >"$config.tmp"
    grep -q '^maxclients : ' "$config.tmp" || echo "maxclients : $fits" >>"$config.tmp"
    mv "$config.tmp" "$config"
    echo "pika-start: maxclients $maxclients lowered to $fits: the open-file limit is $hard and pika reserves $reserved"
  fi
fi

status=0
"$action" rejoin || status=$?
if [ "$status" -ne 0 ]; then
  echo "pika-start: pika-action rejoin failed (exit $status); not starting pika, which could come back as a second master" >&2
  exit "$status"
fi

# pika prints its whole config, passwords included, to stderr at start (before its own log is set up).
exec /bin/sh "$(dirname "$0")/exec-redacted.sh" "$pika" -c "$config"
