#!/bin/sh
# memberLeave of the etcd component: remove the leaving pod's member before KubeBlocks deletes the pod, so that the
# quorum shrinks with the cluster instead of counting a member that is gone. Idempotent: a member that is already
# gone is success. KubeBlocks retries a failure every second and deletes the pod only after success.
set -eu
. "${ETCD_SCRIPTS_DIR:-/scripts}/etcd-lib.sh"

: "${PEER_FQDNS:?PEER_FQDNS is required}"
leaving_fqdn="${KB_LEAVE_MEMBER_POD_FQDN:?KB_LEAVE_MEMBER_POD_FQDN is required}"
leaving="${KB_LEAVE_MEMBER_POD_NAME:-${leaving_fqdn%%.*}}"
peer="http://$leaving_fqdn:$ETCD_PEER_PORT"

endpoints=$(etcd_other_endpoints "$leaving")
if [ -z "$endpoints" ]; then
  echo "etcd-member-leave: $leaving is the last member; nothing to remove"
  exit 0
fi
members=$(etcd_ctl --endpoints="$endpoints" member list -w simple)
me=$(etcd_member_by_peer "$members" "$peer")
if [ -z "$me" ]; then
  echo "etcd-member-leave: $leaving is not a member; nothing to do"
  exit 0
fi
etcd_ctl --endpoints="$endpoints" member remove "${me%% *}"
echo "etcd-member-leave: removed $leaving (member ${me%% *})"
