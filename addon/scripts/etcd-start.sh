#!/bin/sh
# An etcd member of the Codis coordinator. Codis 3.2 needs the v2 API (--enable-v2); pika-action uses v3 for its
# locks. Membership follows the component's pods, with no member list written anywhere:
#   - a restarted member starts from its data (the initial-* flags are then ignored by etcd);
#   - a fresh cluster, where no other peer answers, bootstraps "new" from PEER_FQDNS;
#   - a pod added by scale-out adds itself to the running cluster and joins it "existing";
#   - a pod whose volume was lost replaces its old member (remove, add) and joins "existing".
# Scale-in removes members in etcd-member-leave.sh (the component's memberLeave).
set -eu
. "${ETCD_SCRIPTS_DIR:-/scripts}/etcd-lib.sh"

: "${POD_NAME:?POD_NAME is required}" "${PEER_FQDNS:?PEER_FQDNS is required}"
data_dir="${ETCD_DATA_DIR:-/var/lib/etcd/data}"
token="${ETCD_CLUSTER_TOKEN:-etcd}"

self_fqdn=""
initial=""
for fqdn in $(printf '%s' "$PEER_FQDNS" | tr ',' ' '); do
  name="${fqdn%%.*}"
  initial="${initial:+$initial,}$name=http://$fqdn:$ETCD_PEER_PORT"
  [ "$name" = "$POD_NAME" ] && self_fqdn="$fqdn"
done
if [ -z "$self_fqdn" ]; then
  echo "etcd-start: $POD_NAME is not among PEER_FQDNS ($PEER_FQDNS)" >&2
  exit 2
fi
self_peer="http://$self_fqdn:$ETCD_PEER_PORT"
others=$(etcd_other_endpoints "$POD_NAME")
state=new

if [ -d "$data_dir/member/wal" ] && [ -n "$(ls -A "$data_dir/member/wal")" ]; then
  echo "etcd-start: $POD_NAME restarts from $data_dir"
elif [ -n "$others" ] && members=$(etcd_ctl --endpoints="$others" member list -w simple 2>/dev/null) && [ -n "$members" ]; then
  me=$(etcd_member_by_peer "$members" "$self_peer")
  if [ -n "$me" ] && [ "${me#* }" = started ]; then
    echo "etcd-start: $POD_NAME lost its data; replacing member ${me%% *}"
    etcd_ctl --endpoints="$others" member remove "${me%% *}"
    me=""
  fi
  if [ -z "$me" ]; then
    echo "etcd-start: adding $POD_NAME to the running cluster"
    etcd_ctl --endpoints="$others" member add "$POD_NAME" --peer-urls="$self_peer" >/dev/null
  fi
  members=$(etcd_ctl --endpoints="$others" member list -w simple)
  initial=$(etcd_initial_cluster "$members")
  state=existing
  echo "etcd-start: $POD_NAME joins $initial"
else
  echo "etcd-start: $POD_NAME bootstraps a new cluster: $initial"
fi

exec etcd \
  --name="$POD_NAME" \
  --data-dir="$data_dir" \
  --listen-client-urls="http://0.0.0.0:$ETCD_CLIENT_PORT" \
  --advertise-client-urls="http://$self_fqdn:$ETCD_CLIENT_PORT" \
  --listen-peer-urls="http://0.0.0.0:$ETCD_PEER_PORT" \
  --initial-advertise-peer-urls="$self_peer" \
  --initial-cluster="$initial" \
  --initial-cluster-state="$state" \
  --initial-cluster-token="$token" \
  --enable-v2=true \
  --auto-compaction-mode=periodic \
  --auto-compaction-retention="${ETCD_AUTO_COMPACTION_RETENTION:-1h}" \
  --quota-backend-bytes="${ETCD_QUOTA_BACKEND_BYTES:-2147483648}" \
  --log-level="${ETCD_LOG_LEVEL:-info}"
