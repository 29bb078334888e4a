#!/bin/sh
# Installs the Debian 12 packages idemgate needs, and only those that are missing: a machine that
# has them all is not touched (no apt-get update, no root needed).
#   scripts/deps.sh run          what building and running the gateway needs (`make run`)
#   scripts/deps.sh [test]       that and every test tool (`make test`, `make chaos`, `make fuzz`)
#   scripts/deps.sh SET --list   prints the Debian packages of SET, one a line, and installs nothing
#
# Run: a compiler and the development packages the gateway links (libmicrohttpd, libcurl, cJSON,
# libpq, OpenSSL), PostgreSQL 15 (server and psql), curl (make run's readiness check),
# ca-certificates (libcurl's https to real providers) and nodejs (the build embeds the console's
# charting library from npm: scripts/npm-tools.sh adds Debian's npm when no npm is found).
# Test: cmocka, pytest (with pytest-xdist: make integration runs its files on TEST_WORKERS
# processes) and the Python packaging tools, clang with libFuzzer (make fuzz-regress),
# strace, faketime, openssl (its command makes test_tls.py's certificate), pgbouncer
# (tests/integration/test_pgbouncer.py only, its own instance on a Unix socket; Debian enables
# its service, which listens on localhost:6432 where systemd runs),
# locales, prometheus (for its promtool: make test checks the metrics and the alert rules; the
# server its package starts is stopped and disabled again) and s3rver (npm: the S3-compatible
# server of the archive tests, scripts/s3rver.sh).
set -eu

RUN_PKGS="gcc make pkg-config libc6-dev libmicrohttpd-dev libcurl4-openssl-dev libcjson-dev
libpq-dev libssl-dev postgresql-15 postgresql-client-15 curl ca-certificates nodejs util-linux"
TEST_PKGS="libcmocka-dev python3 python3-pytest python3-pytest-xdist procps locales python3-yaml
strace faketime openssl pgbouncer python3-pip python3-venv python3-setuptools python3-wheel clang libclang-rt-14-dev
prometheus"

set_=${1:-test}
case "$set_" in
run) PKGS=$RUN_PKGS ;;
test) PKGS="$RUN_PKGS $TEST_PKGS" ;;
*) echo "usage: scripts/deps.sh [run|test] [--list]" >&2; exit 2 ;;
esac
if [ "${2:-}" = "--list" ]; then
    for p in $PKGS; do echo "$p"; done
    exit 0
fi

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
if [ -n "$missing" ]; then
    echo "deps: installing missing Debian packages ($set_):$missing"
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
fi
if [ "$set_" = test ]; then
    # The S3-compatible server of the archive tests (npm): installed once, when missing.
    "$(dirname "$0")/s3rver.sh" >/dev/null
fi
