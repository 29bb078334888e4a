#!/bin/sh
# `make run`: a local PostgreSQL (unless DATABASE_URL is set), migrations, a demo tenant, a local
# admin token, the mock provider and the gateway; prints the addresses, the tokens and the
# DATABASE_URL the CLI needs. Ctrl-C (or SIGTERM to this script) stops the gateway and the mock it
# started; the local PostgreSQL keeps running (scripts/pg.sh stop DIR stops it).
#
# Everything is optional (`make run CONFIG=… PORT=…` passes the first two):
#   CONFIG        configuration file (default deploy/idemgate.example.json)
#   PORT          the gateway's port (default: the configuration's `listen`; the example's 8080)
#   MOCK_PORT     the bundled mock provider's port (default 9090). It is started for the example
#                 configuration, and for a CONFIG that names http://127.0.0.1:MOCK_PORT
#   RUN_DIR       tokens, logs and the local archive (default .run)
#   PGDATA_DIR    the local PostgreSQL cluster (default .pgdata; Unix socket inside it, no TCP)
#   PG_PORT       that cluster's port number, i.e. its socket's name (default 5432)
#   DATABASE_URL  an existing database instead of the local cluster
set -eu
caller=$(pwd)
cd "$(dirname "$0")/.."
ROOT=$(pwd)

abs() { case "$1" in /*) echo "$1" ;; *) echo "$caller/$1" ;; esac; }

EXAMPLE=deploy/idemgate.example.json
CONFIG=$(abs "${CONFIG:-$ROOT/$EXAMPLE}")
[ -r "$CONFIG" ] || { echo "run: cannot read the configuration $CONFIG" >&2; exit 1; }
RUN=$(abs "${RUN_DIR:-.run}")
PGDATA_DIR=$(abs "${PGDATA_DIR:-.pgdata}")
MOCK_PORT=${MOCK_PORT:-9090}
mkdir -p "$RUN"

# A member of the configuration file, read with sed (the file is JSON; only top-level settings
# that occur once are asked for): prints its string value, nothing when it is absent.
setting() {
    sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\\([^\"]*\\)\".*/\\1/p" "$CONFIG" | head -n 1
}

# The example points its providers at the mock on 127.0.0.1:9090; another MOCK_PORT runs a copy
# of it (in RUN_DIR, its profiles named by absolute path) pointed at that port.
IS_EXAMPLE=0
if [ "$CONFIG" = "$ROOT/$EXAMPLE" ]; then
    IS_EXAMPLE=1
    START_MOCK=1
    if [ "$MOCK_PORT" != 9090 ]; then
        sed -e "s#127\\.0\\.0\\.1:9090#127.0.0.1:$MOCK_PORT#g" \
            -e "s#\"profile\": \"providers/#\"profile\": \"$ROOT/deploy/providers/#g" \
            "$CONFIG" >"$RUN/idemgate.json"
        CONFIG=$RUN/idemgate.json
    fi
elif grep -q "127\\.0\\.0\\.1:$MOCK_PORT" "$CONFIG"; then
    START_MOCK=1
else
    START_MOCK=0
fi
export IDEMGATE_CONFIG="$CONFIG"

# The gateway's address: PORT on the configuration's host, unless IDEMGATE_LISTEN is set (the
# gateway's own rule: the environment wins over the file).
if [ -n "${PORT:-}" ] && [ -z "${IDEMGATE_LISTEN:-}" ]; then
    listen=$(setting listen)
    export IDEMGATE_LISTEN="${listen%:*}:$PORT"
    [ -n "$listen" ] || IDEMGATE_LISTEN="127.0.0.1:$PORT"
fi

OWN_DB=0
if [ -z "${DATABASE_URL:-}" ]; then
    DATABASE_URL=$(scripts/pg.sh start "$PGDATA_DIR" "${PG_PORT:-5432}")
    OWN_DB=1
fi
export DATABASE_URL
# Outputs of completed jobs are archived here (GET /v1/jobs/{id}/outputs/{n}), unless the
# configuration names its own folder.
if [ -z "$(setting archive_dir)" ]; then
    export IDEMGATE_ARCHIVE_DIR="${IDEMGATE_ARCHIVE_DIR:-$RUN/archive}"
fi
# The example providers are the bundled mock, which accepts any key.
export MOCK_IMAGES_API_KEY="${MOCK_IMAGES_API_KEY:-sk-local-demo}"

build/idemgate check-config
build/idemgate migrate >"$RUN/migrate.log" 2>&1 || {
    echo "run: idemgate migrate failed:" >&2; cat "$RUN/migrate.log" >&2; exit 1; }
umask 077
if [ ! -s "$RUN/demo.token" ]; then
    build/idemgate tenant add "demo-$(date +%s)" >"$RUN/demo.token"
fi
TOKEN=$(cat "$RUN/demo.token")

# The admin API (and the console) need an admin token: a local one is made once and kept in
# RUN_DIR; the gateway is given only its SHA-256. A configuration (or an environment) that
# names its own admin_token_sha256 keeps it.
ADMIN=""
if [ -z "${IDEMGATE_ADMIN_TOKEN_SHA256:-}" ] && [ -z "$(setting admin_token_sha256)" ]; then
    if [ ! -s "$RUN/admin.token" ]; then
        printf 'iga_%s\n' "$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')" >"$RUN/admin.token"
    fi
    ADMIN=$(cat "$RUN/admin.token")
    IDEMGATE_ADMIN_TOKEN_SHA256=$(printf '%s' "$ADMIN" | sha256sum | cut -d' ' -f1)
    export IDEMGATE_ADMIN_TOKEN_SHA256
fi

GW="" MOCK=""
# Stops the processes this script started, by PID, and waits for them.
stop() {
    for pid in $GW $MOCK; do kill "$pid" 2>/dev/null || true; done
    for pid in $GW $MOCK; do wait "$pid" 2>/dev/null || true; done
    rm -f "$RUN/gateway.pid" "$RUN/mock.pid"
}
trap 'stop; exit 0' INT TERM

if [ "$START_MOCK" = 1 ]; then
    build/idemgate-mock --listen "127.0.0.1:$MOCK_PORT" >"$RUN/mock.log" 2>&1 &
    MOCK=$!
    echo "$MOCK" >"$RUN/mock.pid"
fi
build/idemgate serve >"$RUN/gateway.out" 2>"$RUN/gateway.log" &
GW=$!
echo "$GW" >"$RUN/gateway.pid"

# The address the gateway says it listens on, then its readiness.
addr=""
for _ in $(seq 300); do
    addr=$(sed -n 's/^idemgate listening on //p' "$RUN/gateway.out")
    [ -n "$addr" ] && break
    if ! kill -0 "$GW" 2>/dev/null; then
        echo "run: the gateway stopped; the end of $RUN/gateway.log:" >&2
        tail -n 20 "$RUN/gateway.log" >&2
        GW=""
        stop
        exit 1
    fi
    sleep 0.1
done
[ -n "$addr" ] || { echo "run: the gateway did not start (see $RUN/gateway.log)" >&2; stop; exit 1; }
host=${addr%:*}
case "$host" in 0.0.0.0 | "" | "*") host=127.0.0.1 ;; esac
URL="http://$host:${addr##*:}"
for _ in $(seq 100); do
    curl -fs "$URL/readyz" >/dev/null 2>&1 && break
    sleep 0.1
done

echo
echo "idemgate is listening on $URL (configuration: $CONFIG; logs: $RUN/gateway.log)"
[ "$START_MOCK" = 1 ] && echo "mock provider: http://127.0.0.1:$MOCK_PORT (its calls: curl -s http://127.0.0.1:$MOCK_PORT/_ledger)"
echo
echo "console:      $URL/console"
if [ -n "$ADMIN" ]; then
    echo "admin token:  $ADMIN"
    echo "              (a local development token make run created for this gateway, kept in"
    echo "              $RUN/admin.token; the gateway holds only its SHA-256. Sign in to the"
    echo "              console with it, or send it to the admin API: Authorization: Bearer …)"
else
    echo "admin token:  the one whose SHA-256 your configuration or IDEMGATE_ADMIN_TOKEN_SHA256 names"
fi
echo "tenant token: $TOKEN"
echo "              (the demo tenant's, in $RUN/demo.token)"
echo
echo "The CLI (tenants, budgets, jobs) talks to the database directly; in another shell:"
echo
if [ "$OWN_DB" = 1 ]; then
    echo "  export DATABASE_URL='$DATABASE_URL'"
else
    echo "  export DATABASE_URL=…   # the one make run was given"
fi
echo "  export IDEMGATE_CONFIG='$CONFIG'"
echo "  build/idemgate tenant add alice"
echo "  build/idemgate jobs list --state review"
if [ "$OWN_DB" = 1 ]; then
    echo
    echo "PostgreSQL: $PGDATA_DIR (it keeps running; scripts/pg.sh stop $PGDATA_DIR stops it)."
fi
if [ "$IS_EXAMPLE" = 1 ]; then
    cat <<MSG

Try (send it twice: the second answer carries 'Idempotent-Replayed: true' and the mock saw one
create):

  curl -s -i $URL/v1/providers/mock-images/images/generations \\
    -H 'Authorization: Bearer $TOKEN' \\
    -H 'Idempotency-Key: poster-42-v1' -H 'Prefer: wait=10' \\
    -d '{"prompt": "a lighthouse at dawn", "n": 2}'

The OpenAI SDK drop-in (README, "Drop-in for an OpenAI-style SDK") works against this gateway:
baseURL $URL/v1/providers/openai (the openai-images profile, aimed at the mock),
apiKey the tenant token.
MSG
fi
echo
echo "Ctrl-C stops the gateway and the mock."
rc=0
wait "$GW" || rc=$?
GW=""
stop
exit "$rc"
