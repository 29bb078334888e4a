#!/bin/sh
# Installs the Debian 12 packages idemgate needs to build, run and test, and only those that are
# missing: a machine that has them all is not touched (no apt-get update, no root needed).
# pgbouncer is for tests/integration/test_pgbouncer.py only (its own instance, Unix socket only);
# Debian enables its service, which listens on localhost:6432 where systemd runs.
set -eu

PKGS="gcc make pkg-config libc6-dev libmicrohttpd-dev libcurl4-openssl-dev libcjson-dev libpq-dev
libssl-dev libcmocka-dev postgresql-15 postgresql-client-15 python3 python3-pytest curl procps
util-linux locales
python3-yaml strace nodejs faketime pgbouncer
python3-pip python3-venv python3-setuptools python3-wheel
clang libclang-rt-14-dev
prometheus"

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
if [ -z "$missing" ]; then
    # The S3-compatible server of the archive tests (npm): installed once, when missing.
    "$(dirname "$0")/s3rver.sh" >/dev/null
    exit 0
fi

echo "deps: installing missing Debian packages:$missing"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "deps: need root (or sudo) to install:$missing" >&2; exit 1; }
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
# The package lists of a fresh machine may be empty or stale: refresh once, then install.
$SUDO apt-get update -qq || true
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
# prometheus is installed for its promtool only (make test checks the metrics and the alert
# rules with it): the server its package starts is stopped and disabled again.
case " $missing " in
*" prometheus "*)
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
    elif [ -x /etc/init.d/prometheus ]; then
        $SUDO /etc/init.d/prometheus stop >/dev/null 2>&1 || true
        $SUDO update-rc.d prometheus disable >/dev/null 2>&1 || true
    fi
    ;;
esac
"$(dirname "$0")/s3rver.sh" >/dev/null
