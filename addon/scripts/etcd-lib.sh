# Shared by etcd-start.sh and etcd-member-leave.sh (sourced; POSIX sh as busybox ash runs it).
# Members are named after their pods, and every peer URL is http://<pod FQDN>:<peer port>, whose first DNS label is
# the pod's, hence the member's, name.

ETCD_CLIENT_PORT="${ETCD_CLIENT_PORT:-2379}"
ETCD_PEER_PORT="${ETCD_PEER_PORT:-2380}"

# etcd_ctl ARGS...: etcdctl with timeouts that fit a KubeBlocks action.
etcd_ctl() {
  etcdctl --dial-timeout=3s --command-timeout=10s "$@"
}

# etcd_other_endpoints POD: the client URLs of every pod in PEER_FQDNS but POD, comma-separated.
etcd_other_endpoints() {
  out=""
  for fqdn in $(printf '%s' "$PEER_FQDNS" | tr ',' ' '); do
    [ "${fqdn%%.*}" = "$1" ] && continue
    out="${out:+$out,}http://$fqdn:$ETCD_CLIENT_PORT"
  done
  printf '%s' "$out"
}

# etcd_member_by_peer LIST PEER_URL: "<id> <status>" of the member with that peer URL in a `member list -w simple`
# output ("<id>, <status>, <name>, <peer urls>, <client urls>, <is learner>" per line); nothing if there is none.
etcd_member_by_peer() {
  printf '%s\n' "$1" | awk -F', ' -v peer="$2" '$4 == peer { print $1, $2; exit }'
}

# etcd_initial_cluster LIST: --initial-cluster for a member joining the listed cluster: name=peer URL of every
# member, a member that has not started yet (no name) being named after its host's first label.
etcd_initial_cluster() {
  printf '%s\n' "$1" | awk -F', ' '
    NF >= 4 {
      name = $3
      if (name == "") { host = $4; sub(/^[a-z]+:\/\//, "", host); sub(/[.:].*$/, "", host); name = host }
      printf "%s%s=%s", sep, name, $4
      sep = ","
    }
    END { print "" }'
}
