#!/bin/sh
# `make run`: a local PostgreSQL (unless DATABASE_URL is set), migrations, a demo tenant, the mock
# provider and the gateway with deploy/idemgate.example.json. Ctrl-C stops what it started.
set -eu
cd "$(dirname "$0")/.."
RUN=.run
mkdir -p "$RUN"

if [ -z "${DATABASE_URL:-}" ]; then
    DATABASE_URL=$(scripts/pg.sh start "$PWD/.pgdata" 5432)
    echo "run: local PostgreSQL in .pgdata/ (scripts/pg.sh stop .pgdata to stop it)"
fi
export DATABASE_URL
export IDEMGATE_CONFIG=deploy/idemgate.example.json
# Outputs of completed jobs are archived here (GET /v1/jobs/{id}/outputs/{n}).
export IDEMGATE_ARCHIVE_DIR="${IDEMGATE_ARCHIVE_DIR:-$PWD/$RUN/archive}"
# The example providers are the bundled mock, which accepts any key.
export MOCK_IMAGES_API_KEY="${MOCK_IMAGES_API_KEY:-sk-local-demo}"

build/idemgate migrate
if [ ! -s "$RUN/demo.token" ]; then
    umask 077
    build/idemgate tenant add "demo-$(date +%s)" >"$RUN/demo.token"
fi
TOKEN=$(cat "$RUN/demo.token")

build/idemgate-mock --listen 127.0.0.1:9090 >"$RUN/mock.log" 2>&1 &
MOCK=$!
build/idemgate serve 2>"$RUN/gateway.log" &
GW=$!
trap 'kill $GW $MOCK 2>/dev/null; wait $GW $MOCK 2>/dev/null; exit 0' INT TERM
for _ in $(seq 50); do
    curl -fs http://127.0.0.1:8080/readyz >/dev/null 2>&1 && break
    sleep 0.1
done

cat <<MSG

idemgate is listening on http://127.0.0.1:8080 (logs: $RUN/gateway.log), mock provider on :9090.
Your tenant token is in $RUN/demo.token. Try:

  curl -s -i http://127.0.0.1:8080/v1/providers/mock-images/images/generations \\
    -H 'Authorization: Bearer $TOKEN' \\
    -H 'Idempotency-Key: poster-42-v1' -H 'Prefer: wait=10' \\
    -d '{"prompt": "a lighthouse at dawn", "n": 2}'

Send it twice: the second answer carries 'Idempotent-Replayed: true' and the mock saw one create
(curl -s http://127.0.0.1:9090/_ledger).

The OpenAI SDK drop-in (README, "Drop-in for an OpenAI-style SDK") works against this gateway:
baseURL http://127.0.0.1:8080/v1/providers/openai (the openai-images profile, aimed at the mock),
apiKey the token in $RUN/demo.token. Ctrl-C stops the gateway and the mock.
MSG
wait $GW
