#!/bin/sh
# codis-proxy's preStop: take this proxy out of the dashboard before it stops, so that codis-fe never lists a proxy
# that is gone and slot moves and promotions never wait for it. The proxy registered itself by its stable pod FQDN
# when it started (codis-proxy --dashboard), so a restarted proxy comes back online under the same address.
# A dashboard that cannot be reached is not an error: the pod stops anyway.
set -u

admin="${CODIS_ADMIN:-/codis/bin/codis-admin}"
dashboard="${CODIS_DASHBOARD_ADDR:?CODIS_DASHBOARD_ADDR is required}"
addr="${PROXY_ADMIN_ADDR:?PROXY_ADMIN_ADDR is required}"

if "$admin" --dashboard="$dashboard" --remove-proxy --addr="$addr" --force; then
  echo "codis-proxy-stop: removed $addr from $dashboard"
else
  echo "codis-proxy-stop: could not remove $addr from $dashboard; it stays listed until this proxy is back" >&2
fi
exit 0
