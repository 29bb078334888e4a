#!/bin/sh
# A throwaway local PostgreSQL 15 cluster for `make run` and the tests.
#   scripts/pg.sh start DIR [PORT]   initdb DIR if needed, start it, print its DATABASE_URL
#   scripts/pg.sh stop DIR           fast shutdown
#   scripts/pg.sh url DIR [PORT]     print the DATABASE_URL only
# The server listens on a Unix socket inside DIR only (no TCP). initdb refuses to run as root, so
# as root the cluster belongs to the unprivileged `postgres` user.
set -eu
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
cmd=${1:?usage: pg.sh start|stop|url DIR [PORT]}
dir=${2:?usage: pg.sh start|stop|url DIR [PORT]}
port=${3:-5432}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

as_owner() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
url() { echo "postgresql:///idemgate?host=$dir/sock&port=$port&user=postgres"; }

case "$cmd" in
start)
    if [ "$(id -u)" -eq 0 ]; then chown postgres "$dir"; chmod 0755 "$dir"; fi
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        as_owner mkdir -p "$dir/data" "$dir/sock"
        as_owner "$PGBIN/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 \
            --no-sync >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    as_owner mkdir -p "$dir/sock"
    if ! as_owner "$PGBIN/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
        as_owner "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start \
            -o "-c listen_addresses='' -c unix_socket_directories='$dir/sock' -p $port -c max_connections=300 -c fsync=on ${PG_EXTRA_OPTS:-}" \
            >/dev/null || { tail -20 "$dir/server.log" >&2; exit 1; }
    fi
    "$PGBIN/psql" -h "$dir/sock" -p "$port" -U postgres -d postgres -qtAc \
        "SELECT 1 FROM pg_database WHERE datname='idemgate'" | grep -q 1 ||
        "$PGBIN/psql" -h "$dir/sock" -p "$port" -U postgres -d postgres -qc "CREATE DATABASE idemgate" >/dev/null
    url
    ;;
stop)
    if [ -f "$dir/data/PG_VERSION" ]; then
        as_owner "$PGBIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
    fi
    ;;
url) url ;;
*) echo "pg.sh: unknown command $cmd" >&2; exit 2 ;;
esac
