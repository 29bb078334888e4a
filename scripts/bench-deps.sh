#!/bin/sh
# Installs the Debian 12 packages `make bench` needs, and only those that are missing: a machine
# that has them all is not touched (no apt-get update, no root needed).
#   wrk                 the HTTP load generator (LuaJIT scripts in bench/)
#   nginx-light         the reverse proxy the gateway is compared with
#   pgbench             the database ceiling: Debian 12 ships it in postgresql-15 (scripts/deps.sh);
#                       postgresql-contrib is installed only if it is missing all the same
#   valgrind            callgrind, instructions per request
#   python3             the idle keep-alive client and the sequential callgrind driver
#   util-linux          setpriv: nginx runs as nobody when the benchmark runs as root
set -eu

PKGS="wrk nginx-light valgrind python3 curl procps util-linux"

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
# pgbench is what matters; whichever package brings it is fine.
if ! command -v pgbench >/dev/null 2>&1 && [ ! -x /usr/lib/postgresql/15/bin/pgbench ]; then
    missing="$missing postgresql-contrib"
fi
[ -z "$missing" ] && exit 0

echo "bench-deps: installing missing Debian packages:$missing"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "bench-deps: need root (or sudo) to install:$missing" >&2; exit 1; }
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
# The package lists of a fresh machine may be empty or stale: refresh once, then install.
# nginx-light's package starts a system nginx on :80 where services may start; the benchmark runs
# its own nginx on another port and never touches that one.
$SUDO apt-get update -qq || true
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
