#!/bin/sh
# Init container of the etcd pods (busybox image): copy the static busybox into the shared volume and link its
# applets there, so that the distroless etcd image (and the kbagent running memberLeave in it) can run the scripts.
set -eu

busybox="${BUSYBOX:-/bin/busybox}"
dest="${SHELL_DIR:-/shell}"

mkdir -p "$dest/bin"
cp "$busybox" "$dest/busybox"
"$dest/busybox" --install -s "$dest/bin"
echo "install-shell: busybox applets in $dest/bin"
