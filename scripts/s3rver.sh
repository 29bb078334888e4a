#!/bin/sh
# Installs s3rver (npm, pinned), the S3-compatible server the archive tests start on 127.0.0.1,
# into .tools/s3rver when it is not there yet, and prints the path of its executable. npm comes
# with Node.js here; on a Debian machine whose nodejs lacks it, Debian's npm package is added.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR="$ROOT/.tools/s3rver"
BIN="$DIR/node_modules/s3rver/bin/s3rver.js"
VERSION=3.7.1

if [ ! -f "$BIN" ]; then
    if ! command -v npm >/dev/null 2>&1; then
        SUDO=""
        [ "$(id -u)" -ne 0 ] && SUDO="sudo"
        echo "s3rver: installing Debian's npm" >&2
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends npm >&2
    fi
    echo "s3rver: npm install s3rver@$VERSION into $DIR" >&2
    mkdir -p "$DIR"
    npm install --no-audit --no-fund --silent --prefix "$DIR" "s3rver@$VERSION" >&2
fi
echo "$BIN"
