#!/usr/bin/env bash
# Installs what the build and the tests need on a Debian machine: protoc (etcd-client's build), etcd-server and
# redis-server (the tests start real ones; redis-server stands in for pika). Idempotent; needs root for apt-get.
set -euo pipefail

need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
# etcd-client's build imports the well-known types (google/protobuf/*.proto), which only libprotobuf-dev ships.
[ -f /usr/include/google/protobuf/descriptor.proto ] || need+=(libprotobuf-dev)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
# The chart tests (tests/, chart-tests) build tests/chart-render from Go's text/template and the libraries Helm is made
# of (GOPATH mode, offline), and run the etcd scripts under busybox sh as the etcd pods do.
command -v go >/dev/null 2>&1 || need+=(golang-go)
gocode=/usr/share/gocode/src
[ -d "$gocode/github.com/Masterminds/sprig" ] || need+=(golang-github-masterminds-sprig-dev)
[ -d "$gocode/gopkg.in/yaml.v3" ] || need+=(golang-gopkg-yaml.v3-dev)
[ -d "$gocode/sigs.k8s.io/yaml" ] || need+=(golang-k8s-sigs-yaml-dev)
[ -d "$gocode/github.com/xeipuuv/gojsonschema" ] || need+=(golang-github-xeipuuv-gojsonschema-dev)
command -v busybox >/dev/null 2>&1 || need+=(busybox)

if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# The Debian packages start services where systemd runs; the tests start their own on free ports instead.
for svc in redis-server etcd; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
    systemctl stop "$svc" || true
  fi
done

command -v cargo >/dev/null 2>&1 || { echo "setup: cargo (Rust toolchain) is required" >&2; exit 1; }
echo "setup: protoc $(protoc --version | cut -d' ' -f2), $(etcd --version | head -1), $(redis-server --version | cut -d' ' -f3)"
