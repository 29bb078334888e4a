#!/bin/sh
# Installs what the container-image test (tests/integration/test_image.py, `make test-image`)
# needs beyond scripts/deps.sh, and only what is missing: podman with its network stack (netavark,
# aardvark-dns for container names, iptables), runc (the test's OCI runtime: Debian 12's crun
# refuses hosts with a hybrid cgroup layout) and debootstrap for the base image.
set -eu
PKGS="podman runc netavark aardvark-dns iptables debootstrap"
missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0
echo "image-deps: installing missing Debian packages:$missing"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "image-deps: need root (or sudo) to install:$missing" >&2; exit 1; }
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || true
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
