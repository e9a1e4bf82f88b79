#!/usr/bin/env bash
# Installs the real servers the addon ships, for the real-pika test bed and the demo, where the tests look for them:
#   /usr/local/lib/pika-kubeblocks/pika/bin/pika                      (the pikadb/pika image's /pika/bin/pika)
#   /usr/local/lib/pika-kubeblocks/codis/bin/codis-{dashboard,proxy,admin}  (the pikadb/codis image's /codis/bin)
# Where from, first found wins:
#   PIKA_BIN (a pika v4.0.1 binary) and CODIS_BIN (a directory holding codis-dashboard, codis-proxy, codis-admin of
#   Pika's Codis fork at the same tag), when set;
#   else the tarballs of ../shared/servers beside this repository, their checksums verified against its SHA256SUMS;
#   else it says how to build them and exits 1.
# Called by scripts/setup.sh; idempotent (a stamp records what was installed).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
dest=/usr/local/lib/pika-kubeblocks
shared="${PIKA_SERVERS_DIR:-$repo/../shared/servers}"
pika_tarball=pika-v4.0.1-linux-amd64.tar.gz
codis_tarball=codis-pika-v4.0.1-linux-amd64.tar.gz

how_to_get() {
  cat >&2 <<'MSG'
install-servers: no real servers to install. The tests run pika v4.0.1 and Pika's Codis fork of the same tag:
  - set PIKA_BIN to a pika binary built from OpenAtomFoundation/pika tag v4.0.1
    (commit 23d9bf6f4a400f3648be514d5f674bd9b8ae632f; ./build.sh, or CMake with target `pika`), and
  - set CODIS_BIN to the directory of codis-dashboard, codis-proxy and codis-admin built from the `codis/` folder of
    the same tag (`cd codis && make`, or `go build ./cmd/...`),
  or put the tarballs pika-v4.0.1-linux-amd64.tar.gz and codis-pika-v4.0.1-linux-amd64.tar.gz with their SHA256SUMS
  in ../shared/servers beside this repository (PIKA_SERVERS_DIR names another directory). Then run scripts/setup.sh again.
MSG
  exit 1
}

install_pika() { install -D -m 0755 "$1" "$dest/pika/bin/pika"; }
install_codis() {
  for tool in codis-dashboard codis-proxy codis-admin; do
    [ -x "$1/$tool" ] || { echo "install-servers: $1/$tool is missing or not executable" >&2; exit 1; }
    install -D -m 0755 "$1/$tool" "$dest/codis/bin/$tool"
  done
}

if [ -n "${PIKA_BIN:-}" ] || [ -n "${CODIS_BIN:-}" ]; then
  [ -n "${PIKA_BIN:-}" ] && [ -n "${CODIS_BIN:-}" ] || {
    echo "install-servers: set both PIKA_BIN and CODIS_BIN, or neither" >&2
    exit 1
  }
  [ -x "$PIKA_BIN" ] || { echo "install-servers: PIKA_BIN=$PIKA_BIN is not an executable file" >&2; exit 1; }
  [ -d "$CODIS_BIN" ] || { echo "install-servers: CODIS_BIN=$CODIS_BIN is not a directory" >&2; exit 1; }
  install_pika "$PIKA_BIN"
  install_codis "$CODIS_BIN"
  rm -f "$dest/STAMP"
  source="PIKA_BIN=$PIKA_BIN CODIS_BIN=$CODIS_BIN"
elif [ -f "$shared/$pika_tarball" ] && [ -f "$shared/$codis_tarball" ] && [ -f "$shared/SHA256SUMS" ]; then
  (cd "$shared" && grep -E " ($pika_tarball|$codis_tarball)\$" SHA256SUMS | sha256sum --check --quiet --strict -) || {
    echo "install-servers: the tarballs in $shared do not match its SHA256SUMS" >&2
    exit 1
  }
  stamp="$(cd "$shared" && sha256sum "$pika_tarball" "$codis_tarball")"
  if [ "$(cat "$dest/STAMP" 2>/dev/null)" != "$stamp" ] || [ ! -x "$dest/pika/bin/pika" ] \
    || [ ! -x "$dest/codis/bin/codis-proxy" ]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    tar -xzf "$shared/$pika_tarball" -C "$work"
    tar -xzf "$shared/$codis_tarball" -C "$work"
    install_pika "$work/pika-v4.0.1/pika"
    install_codis "$work/codis-pika-v4.0.1"
    printf '%s\n' "$stamp" >"$dest/STAMP"
  fi
  source="$shared (checksums verified)"
else
  how_to_get
fi

# A pika that cannot load its libraries aborts only when a test starts it; say so now.
if ldd "$dest/pika/bin/pika" | grep -q "not found"; then
  echo "install-servers: $dest/pika/bin/pika misses libraries:" >&2
  ldd "$dest/pika/bin/pika" | grep "not found" >&2
  exit 1
fi
echo "install-servers: $("$dest/pika/bin/pika" -v 2>&1 | grep -m1 pika_version), Codis fork in $dest/codis/bin, from $source"
