#!/usr/bin/env bash
# `make bench`: the gateway side by side with nginx and PostgreSQL, on this machine.
#
# Starts a throwaway PostgreSQL (fsync and synchronous_commit on: the durable intent is the
# product's promise), the mock provider with no artificial delay, nginx as a plain reverse proxy
# to the same mock, and the gateway; drives each with wrk at BENCH_CONNECTIONS connections for
# BENCH_SECONDS; runs pgbench with the gateway's own intake statement; reads the gateway's memory
# with many idle connections; counts instructions per request under callgrind. Prints one table
# and writes bench/results/latest.json. It reports and never judges: its exit status is 0 unless
# it could not run at all.
#
# It builds nothing: `make all` must have made build/idemgate and build/idemgate-mock (it runs
# copies of them, so that a rebuild during the run changes nothing it measures). Everything
# it starts listens on 127.0.0.1 only, lives in one temporary directory and is stopped by PID on
# exit, failure included.
#
# Settings (environment):
#   BENCH_SECONDS=10            duration of each measured run
#   BENCH_WARMUP_SECONDS=2      unmeasured run before each measured one
#   BENCH_CONNECTIONS=32        wrk connections and pgbench clients
#   BENCH_WIDE_CONNECTIONS=128  the nginx_wide and e2e_wide steps: nginx and the end-to-end run
#                               again with this many clients waiting at once
#   BENCH_PGSS_TRACK=top        pg_stat_statements.track: all also lists the statements inside
#                               functions (their time is then counted twice in the sum)
#   BENCH_HTTP_THREADS=4        the gateway's http_threads (each holds one database connection)
#   BENCH_DISPATCH_WORKERS=4    the gateway's dispatch_workers (end-to-end and replay runs)
#   BENCH_IDLE_CONNECTIONS=1000 idle keep-alive connections held for the memory figure
#   BENCH_CALLGRIND_REQUESTS=2000  requests per path counted under callgrind (0: skip)
#   BENCH_SOAK_REQUESTS=1000000 requests the main gateway serves in all (replays and reads added
#                               until it has), its RSS sampled after each run
#   BENCH_HISTORY_ROWS=10000000 operations stored in bulk before intake is measured again
#   BENCH_TOMBSTONE_ROWS=(as many) key tombstones then stored, and intake measured once more
#   BENCH_SLOW_DELAY_MS=2000    the slow provider's delay (the slow step: nginx and the gateway
#   BENCH_SLOW_CONNECTIONS=1000 with its default settings, Prefer: wait, new keys)
#   BENCH_SLOW_SECONDS=20       duration of each slow run
#   BENCH_INFLIGHT_CALLS=10000  creates submitted at once against a provider that answers after
#   BENCH_INFLIGHT_DELAY_MS=20000  this long (the inflight step: calls in flight, memory,
#                               threads and PostgreSQL connections while they wait)
#   BENCH_ONLY="a b …"          run only these steps (mock nginx e2e replay get soak idle
#                               intake_disp slow inflight intake pgbench callgrind history); the
#                               default is all
#   BENCH_OUT=bench/results/latest.json
#   BENCH_KEEP=1                keep the temporary directory (logs) instead of removing it
#   BENCH_NO_INSTALL=1          do not install missing packages (scripts/bench-deps.sh)
#   BENCH_TIMEOUT=1800          the whole run is stopped after this many seconds
#   BENCH_GATEWAY_ENV="K=V …"   more environment for the gateway only (a setting to compare)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

SECS=${BENCH_SECONDS:-10}
WARM=${BENCH_WARMUP_SECONDS:-2}
CONNS=${BENCH_CONNECTIONS:-32}
WIDE_CONNS=${BENCH_WIDE_CONNECTIONS:-128}
HTTP_THREADS=${BENCH_HTTP_THREADS:-4}
DISPATCH=${BENCH_DISPATCH_WORKERS:-4}
IDLE_N=${BENCH_IDLE_CONNECTIONS:-1000}
CG_N=${BENCH_CALLGRIND_REQUESTS:-2000}
SOAK_N=${BENCH_SOAK_REQUESTS:-1000000}
HIST_N=${BENCH_HISTORY_ROWS:-10000000}
TOMB_N=${BENCH_TOMBSTONE_ROWS:-$HIST_N}
SLOW_DELAY=${BENCH_SLOW_DELAY_MS:-2000}
SLOW_CONNS=${BENCH_SLOW_CONNECTIONS:-1000}
SLOW_SECS=${BENCH_SLOW_SECONDS:-20}
INFL_N=${BENCH_INFLIGHT_CALLS:-10000}
INFL_DELAY=${BENCH_INFLIGHT_DELAY_MS:-20000}
ONLY=${BENCH_ONLY:-mock nginx nginx_wide e2e e2e_wide replay get soak idle intake_disp slow inflight stream intake pgbench callgrind history}
STREAM_EVENTS=${BENCH_STREAM_EVENTS:-200}
STREAM_FB=${BENCH_STREAM_FIRST_BYTE:-25}
STREAM_MANY=${BENCH_STREAM_MANY:-1000}
STREAM_MANY_SECS=${BENCH_STREAM_MANY_SECONDS:-10}
OUT=${BENCH_OUT:-bench/results/latest.json}
TOTAL_TIMEOUT=${BENCH_TIMEOUT:-1800}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}

log() { printf 'bench: %s\n' "$*" >&2; }
want() { case " $ONLY " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

if [ "${BENCH_NO_INSTALL:-0}" != 1 ]; then
    scripts/bench-deps.sh
fi
for b in build/idemgate build/idemgate-mock; do
    [ -x "$b" ] || { log "$b is missing: run \`make all\` first"; exit 1; }
done
for t in wrk nginx valgrind callgrind_control curl; do
    command -v "$t" >/dev/null 2>&1 || { log "$t is missing (scripts/bench-deps.sh installs it)"; exit 1; }
done
PGBENCH=$(command -v pgbench || echo "$PGBIN/pgbench")
NGINX=$(command -v nginx)

# Room for the idle connections, the calls in flight (a socket each, at the gateway and at the
# mock) and the gateway's own, when the soft limit is low.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

T=$(mktemp -d "${TMPDIR:-/tmp}/idemgate-bench.XXXXXX")
chmod 0755 "$T" # PostgreSQL runs as the postgres user when we are root
mkdir -p "$T/results" "$T/logs" "$T/bin"
cp build/idemgate build/idemgate-mock "$T/bin/"
GATEWAY=$T/bin/idemgate
MOCK=$T/bin/idemgate-mock
PIDS=()
PGDIR=""
IDLE_FD=""

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    [ -n "$IDLE_FD" ] && exec {IDLE_FD}>&-
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null
    done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    [ -n "$PGDIR" ] && scripts/pg.sh stop "$PGDIR"
    if [ "${BENCH_KEEP:-0}" = 1 ] || [ "$rc" -ne 0 ]; then
        log "logs kept in $T"
    else
        rm -rf "$T"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# The whole run is bounded: a watchdog of our own (its PID is in PIDS, like everything we start).
# Its sleep holds no descriptor of ours and ends with it.
(
    trap 'kill "$sp" 2>/dev/null; exit 0' TERM
    sleep "$TOTAL_TIMEOUT" </dev/null >/dev/null 2>&1 &
    sp=$!
    wait "$sp" && { echo "bench: stopped after ${TOTAL_TIMEOUT}s (BENCH_TIMEOUT)" >&2; kill -TERM $$; }
) &
PIDS+=($!)

free_port() {
    "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_http() { # URL SECONDS [PID]: until it answers 2xx (or PID, when given, is gone)
    local url=$1 deadline=$(( $(date +%s) + $2 )) pid=${3:-}
    until curl -fs -o /dev/null --max-time 2 "$url"; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        [ -z "$pid" ] || kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.2
    done
}
proc_kib() { # PID FIELD: VmRSS, VmHWM … in KiB
    awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0
}
stop_pid() { # PID: TERM, wait up to 20 s, KILL
    local pid=$1
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
note() { # KEY VALUE (raw JSON): facts for the report
    printf '%s\t%s\n' "$1" "$2" >>"$T/results/facts.tsv"
}

note loadavg_start "$(cut -d' ' -f1 /proc/loadavg)"
note binary "{\"sha256\":\"$(sha256sum "$GATEWAY" | cut -c1-16)\",\"built\":\"$(date -u -r build/idemgate +%Y-%m-%dT%H:%M:%SZ)\"}"
NONCE=$(date +%s)-$$
MOCK_PORT=$(free_port)
NGINX_PORT=$(free_port)
GW_PORT=$(free_port)
log "temporary directory $T; mock :$MOCK_PORT, nginx :$NGINX_PORT, gateway :$GW_PORT"

# --- PostgreSQL, schema, tenant -------------------------------------------------------------
PGDIR=$T/pg
# pg_stat_statements: executor time per statement per end-to-end job (top-level statements: a
# function's own statements are inside its call's time).
DATABASE_URL=$(PG_EXTRA_OPTS="-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=${BENCH_PGSS_TRACK:-top}" \
    scripts/pg.sh start "$PGDIR" 5432)
export DATABASE_URL
PSQL=("$PGBIN/psql" -h "$PGDIR/sock" -p 5432 -U postgres -d idemgate -qAt)
note pg_settings "$("${PSQL[@]}" -c "SELECT json_object_agg(name, setting) FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'wal_sync_method', 'shared_buffers', 'max_connections', 'server_version')")"

sed -e "s#@MOCK_URL@#http://127.0.0.1:$MOCK_PORT#" -e "s#@PROFILES@#$REPO/deploy/providers#" \
    bench/idemgate.bench.json >"$T/gateway.json"
export IDEMGATE_CONFIG=$T/gateway.json
export IDEMGATE_BENCH_PROVIDER_KEY=sk-bench-not-a-secret
timeout 60 "$GATEWAY" migrate >/dev/null
"${PSQL[@]}" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null 2>&1 ||
    log "pg_stat_statements is not available: no executor time per job"
TOKEN=$(timeout 30 "$GATEWAY" tenant add "bench-$$")
TENANT_ID=$("${PSQL[@]}" -c "SELECT id FROM tenants WHERE name = 'bench-$$'")

# --- the mock provider and nginx -----------------------------------------------------------
"$MOCK" --listen "127.0.0.1:$MOCK_PORT" >"$T/logs/mock.out" 2>/dev/null &
MOCK_PID=$!
PIDS+=("$MOCK_PID")
wait_http "http://127.0.0.1:$MOCK_PORT/_health" 20 "$MOCK_PID" || { log "the mock did not start"; exit 1; }

start_nginx() { # DIR PORT UPSTREAM_PORT: nginx in $T/DIR, its PID in NGINX_PID
    local dir=$T/$1 port=$2 upstream=$3
    mkdir -p "$dir"
    sed -e "s#@PREFIX@#$dir#g" -e "s#@LISTEN@#127.0.0.1:$port#" \
        -e "s#@UPSTREAM@#127.0.0.1:$upstream#" bench/nginx.conf >"$dir/nginx.conf"
    if [ "$(id -u)" -eq 0 ]; then
        # As root, nginx itself runs as nobody: its master needs no privilege on a high port.
        chown -R nobody:nogroup "$dir"
        setpriv --reuid=nobody --regid=nogroup --clear-groups \
            "$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" &
    else
        "$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" &
    fi
    NGINX_PID=$!
    PIDS+=("$NGINX_PID")
    wait_http "http://127.0.0.1:$port/_health" 20 "$NGINX_PID" || { log "nginx ($1) did not start"; cat "$dir/error.log" >&2; exit 1; }
}
start_nginx nginx "$NGINX_PORT" "$MOCK_PORT"

# --- the gateway ---------------------------------------------------------------------------
GW_PID=""
start_gateway() { # NAME DISPATCH_WORKERS [WRAPPER…]
    local name=$1 disp=$2
    shift 2
    # /readyz probes the archive: give it a folder of the run's own (the default is under
    # /var/lib, writable by root only).
    env IDEMGATE_LISTEN="127.0.0.1:$GW_PORT" IDEMGATE_HTTP_THREADS="$HTTP_THREADS" \
        IDEMGATE_DISPATCH_WORKERS="$disp" IDEMGATE_INSTANCE_ID="bench-$name" \
        IDEMGATE_ARCHIVE_DIR="$T/archive" ${BENCH_GATEWAY_ENV:-} \
        "$@" "$GATEWAY" serve >"$T/logs/gateway-$name.log" 2>&1 &
    GW_PID=$!
    PIDS+=("$GW_PID")
    wait_http "http://127.0.0.1:$GW_PORT/readyz" 120 "$GW_PID" || { log "the gateway ($name) did not become ready"; tail "$T/logs/gateway-$name.log" >&2; exit 1; }
}

# --- wrk -----------------------------------------------------------------------------------
INTAKE_PATH=/v1/providers/mock-images/images/generations
GW=http://127.0.0.1:$GW_PORT
requests_served=0
rss_samples=()

wrk_run() { # NAME SCRIPT URL PREFER [KEY [CONNECTIONS]]: a warm-up, then the measured run
    local name=$1 script=$2 url=$3 prefer=$4 key=${5:-} conns=${6:-$CONNS} threads=2
    [ "$conns" -lt 2 ] && threads=1
    local -a envs=(BENCH_WRK_DIR="$REPO/bench/wrk" BENCH_TOKEN="$TOKEN" BENCH_PREFER="$prefer" BENCH_KEY="$key")
    case $name in e2e|e2e_wide|stream_live) drain "${name}_start" ;; esac # earlier steps' work done
    if [ "$WARM" -gt 0 ]; then
        env "${envs[@]}" BENCH_NONCE="$NONCE-$name-warm" timeout $((WARM + 60)) \
            wrk -t"$threads" -c"$conns" -d"${WARM}s" --timeout 35s -s "bench/wrk/$script" "$url" \
            >"$T/logs/wrk-$name-warm.out" 2>&1 || true
    fi
    case $name in e2e|e2e_wide|stream_live|intake) cost_begin ;; esac
    log "$name: wrk -t$threads -c$conns -d${SECS}s $url"
    env "${envs[@]}" BENCH_NONCE="$NONCE-$name" timeout $((SECS + 60)) \
        wrk -t"$threads" -c"$conns" -d"${SECS}s" --timeout 35s -s "bench/wrk/$script" "$url" \
        >"$T/logs/wrk-$name.out" 2>&1 || log "$name: wrk failed (see $T/logs/wrk-$name.out)"
    grep '^@@BENCH ' "$T/logs/wrk-$name.out" | sed 's/^@@BENCH //' >"$T/results/$name.json" || true
    case $name in e2e|e2e_wide|stream_live|intake) cost_end "$name" ;; esac
    for f in "$T/logs/wrk-$name-warm.out" "$T/logs/wrk-$name.out"; do
        [ -f "$f" ] || continue
        n=$(sed -n 's/^@@BENCH {"requests":\([0-9]*\).*/\1/p' "$f")
        requests_served=$((requests_served + ${n:-0}))
    done
}
# The cost of one job, over the measured e2e and stream_live runs: PostgreSQL executor time per
# statement (pg_stat_statements, reset when the run starts), PostgreSQL's CPU and the gateway's
# CPU (utime + stime from /proc), each divided by the jobs the run completed.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
# PostgreSQL's CPU: the postmaster and every process it started (backends, walwriter, …), and
# what its children that ended used. CPU, not wall time: it does not count waiting for a core.
pg_cpu_ticks() {
    local pm t=0 pid
    pm=$(head -1 "$PGDIR/data/postmaster.pid" 2>/dev/null) || { echo 0; return; }
    t=$(awk '{ print $14 + $15 + $16 + $17 }' "/proc/$pm/stat" 2>/dev/null || echo 0)
    for pid in $(pgrep -P "$pm"); do
        t=$((t + $(cpu_ticks "$pid")))
    done
    echo "$t"
}
# Updates of operations over the run, and how many were HOT (no index entry written: the
# statistics' cumulative counters, read before and after; they reach the view within a second).
upd_counts() {
    "${PSQL[@]}" -c "SELECT n_tup_upd || ' ' || n_tup_hot_upd FROM pg_stat_user_tables
        WHERE relname = 'operations'" 2>/dev/null || echo "0 0"
}
cost_begin() {
    COST_UPD0=$(upd_counts)
    COST_TICKS0=$(cpu_ticks "$GW_PID")
    COST_PG0=$(pg_cpu_ticks)
    "${PSQL[@]}" -c "SELECT pg_stat_statements_reset()" >/dev/null 2>&1 || true
}
# The work a run left behind (outputs still to archive, jobs not ended) is the run's own cost,
# and would otherwise load the next run: a measured run starts once earlier steps' work is done,
# and its cost is counted once its own is (each wait at most BENCH_DRAIN_SECONDS; what was still
# left is said).
drain() { # RUN
    local left t0=$SECONDS
    while :; do
        left=$("${PSQL[@]}" -c "SELECT /* bench drain */ (SELECT count(*) FROM archive_outputs WHERE state = 'pending')
            + (SELECT count(*) FROM operations WHERE state IN ('prepared', 'sending'))" 2>/dev/null || echo 0)
        [ "${left:-0}" -eq 0 ] && break
        [ $((SECONDS - t0)) -ge "${BENCH_DRAIN_SECONDS:-120}" ] && break
        sleep 0.5
    done
    note "$1_drain" "{\"seconds\":$((SECONDS - t0)),\"left\":${left:-0}}"
    [ "${left:-0}" -eq 0 ] || log "$1: $left outputs or jobs still left after ${BENCH_DRAIN_SECONDS:-120} s"
}
cost_end() { # RUN: e2e_cost, stream_live_cost or intake_cost, from results/RUN.json, once the
    # run's work is done (the intake replica has no dispatcher: its run's work is the intents)
    local ticks jobs hz stmts pg
    [ "$1" = intake ] || drain "$1"
    ticks=$(( $(cpu_ticks "$GW_PID") - COST_TICKS0 ))
    pg=$(( $(pg_cpu_ticks) - COST_PG0 ))
    hz=$(getconf CLK_TCK)
    jobs=$(sed -n 's/^{"requests":\([0-9]*\).*/\1/p' "$T/results/$1.json")
    stmts=$("${PSQL[@]}" -c "SELECT coalesce(json_agg(s ORDER BY s.ms DESC), '[]') FROM (
        SELECT left(regexp_replace(query, '\s+', ' ', 'g'), 70) AS query, calls,
               round(total_exec_time::numeric, 3) AS ms
        FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'idemgate')
          AND query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%bench drain%') s" 2>/dev/null | tr -d '\n' || echo null)
    sleep 1
    local upd0 hot0 upd1 hot1
    read -r upd0 hot0 <<<"${COST_UPD0:-0 0}"
    read -r upd1 hot1 <<<"$(upd_counts)"
    note "$1_cost" "{\"jobs\":${jobs:-0},\"gateway_cpu_ticks\":$ticks,\"postgresql_cpu_ticks\":$pg,\"clk_tck\":$hz,\"operations_updates\":$((${upd1:-0} - ${upd0:-0})),\"operations_hot_updates\":$((${hot1:-0} - ${hot0:-0})),\"statements\":${stmts:-null}}"
}
sample_rss() { # LABEL: the gateway's resident memory now, with the requests served so far
    rss_samples+=("{\"after\":\"$1\",\"requests\":$requests_served,\"rss_kib\":$(proc_kib "$GW_PID" VmRSS)}")
}

# --- 1. the baselines: the mock directly and through nginx ---------------------------------
# The mock's ledger holds a million creates (then answers 507): a baseline can fill it on a
# quiet machine, so it is cleared after each one and starts empty for the gateway's runs.
reset_mock() {
    curl -fs -o /dev/null --max-time 10 -X POST "http://127.0.0.1:$MOCK_PORT/_reset" ||
        log "the mock's ledger could not be cleared"
}
want mock && { wrk_run mock unique.lua "http://127.0.0.1:$MOCK_PORT/v1/images/generations" ""; reset_mock; }
want nginx && { wrk_run nginx unique.lua "http://127.0.0.1:$NGINX_PORT/v1/images/generations" ""; reset_mock; }
want nginx_wide && { wrk_run nginx_wide unique.lua "http://127.0.0.1:$NGINX_PORT/v1/images/generations" "" "" "$WIDE_CONNS"; reset_mock; }

# --- 2. the gateway with dispatchers: end to end, replay, GET, idle connections ------------
REPLAY_KEY="bench-$NONCE-replay"
if want e2e || want e2e_wide || want replay || want get || want idle || want intake_disp; then
    start_gateway main "$DISPATCH"
    requests_served=0
    note gateway_main "{\"http_threads\":$HTTP_THREADS,\"dispatch_workers\":$DISPATCH}"
    sample_rss start
    want e2e && { wrk_run e2e unique.lua "$GW$INTAKE_PATH" "wait=30"; sample_rss e2e; }

    # One completed job: the replayed key and the job read.
    hdrs=$(curl -s -D - -o "$T/logs/replay-first.body" --max-time 40 "$GW$INTAKE_PATH" \
        -H "Authorization: Bearer $TOKEN" -H "Idempotency-Key: $REPLAY_KEY" -H 'Prefer: wait=30' \
        -H 'Content-Type: application/json' \
        -d '{"prompt":"a lighthouse at dawn, watercolour","n":1,"size":"1024x1024"}' | tr -d '\r')
    JOB_ID=$(printf '%s\n' "$hdrs" | sed -n 's/^X-Idemgate-Job-Id: //Ip')
    JOB_STATE=$(printf '%s\n' "$hdrs" | sed -n 's/^X-Idemgate-State: //Ip')
    [ "$JOB_STATE" = completed ] || log "the replayed job is '$JOB_STATE', not completed"
    note replay_job "{\"id\":\"$JOB_ID\",\"state\":\"$JOB_STATE\"}"

    want replay && { wrk_run replay reuse.lua "$GW$INTAKE_PATH" "wait=30" "$REPLAY_KEY"; sample_rss replay; }
    want get && { wrk_run get get.lua "$GW/v1/jobs/$JOB_ID" ""; sample_rss get; }

    # Intake while the dispatchers work through what it accepts: last, so that its backlog
    # disturbs no other run.
    want intake_disp && { wrk_run intake_disp unique.lua "$GW$INTAKE_PATH" "wait=0"; sample_rss intake_disp; }
    # Memory over many requests: replays and reads until the gateway has served SOAK_N in all
    # (at most 20 more runs), RSS sampled after each.
    if want soak && [ -n "${JOB_ID:-}" ]; then
        for i in $(seq 10); do
            [ "$requests_served" -lt "$SOAK_N" ] || break
            wrk_run "soak-replay-$i" reuse.lua "$GW$INTAKE_PATH" "wait=30" "$REPLAY_KEY"
            sample_rss "soak-replay-$i"
            wrk_run "soak-get-$i" get.lua "$GW/v1/jobs/$JOB_ID" ""
            sample_rss "soak-get-$i"
        done
    fi
    note gateway_main_memory "{\"peak_rss_kib\":$(proc_kib "$GW_PID" VmHWM),\"rss_kib\":$(proc_kib "$GW_PID" VmRSS),\"requests\":$requests_served,\"samples\":[$(IFS=,; echo "${rss_samples[*]}")]}"

    # Last: memory with many idle keep-alive connections (each had one request answered).
    if want idle; then
        before=$(proc_kib "$GW_PID" VmRSS)
        coproc IDLE { exec timeout 120 "$PY" bench/tools/idle_conns.py 127.0.0.1 "$GW_PORT" "$IDLE_N" "/v1/jobs/$JOB_ID" "$TOKEN"; }
        PIDS+=("$IDLE_PID")
        IDLE_FD=${IDLE[1]}
        line=""
        read -r -t 90 line <&"${IDLE[0]}" || true
        sleep 1
        with=$(proc_kib "$GW_PID" VmRSS)
        log "idle: $line; RSS $before KiB before, $with KiB with them"
        exec {IDLE_FD}>&-
        IDLE_FD=""
        stop_pid "$IDLE_PID"
        sleep 1
        after=$(proc_kib "$GW_PID" VmRSS)
        set -- $line
        note idle "{\"connections\":${2:-0},\"answered_200\":${3:-0},\"rss_before_kib\":$before,\"rss_with_kib\":$with,\"rss_after_close_kib\":$after}"
        requests_served=$((requests_served + ${2:-0}))
    fi

    # End to end again with more clients waiting at once: a job is three commits in a row
    # (intake, the start of its send, its result), so at CONNS clients the run is bounded by
    # that latency and the cores are partly idle. After the memory figures (more connections
    # hold more buffers), before the peak.
    want e2e_wide && wrk_run e2e_wide unique.lua "$GW$INTAKE_PATH" "wait=30" "" "$WIDE_CONNS"

    note gateway_main_peak "{\"peak_rss_kib\":$(proc_kib "$GW_PID" VmHWM)}"
    stop_pid "$GW_PID"
fi

# --- 2b. a slow provider: calls that take seconds ---------------------------------------------
# A second mock that answers every create after SLOW_DELAY ms (INFL_DELAY for the inflight step),
# nginx in front of it, and the gateway with its default dispatch settings in front of it.
gw_threads() { awk '$1 == "Threads:" { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
pg_clients() { # client connections to the bench's PostgreSQL, psql's own excluded
    "${PSQL[@]}" -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()" 2>/dev/null || echo 0
}
gw_metric() { # NAME: a metric's value from the gateway's /metrics, or null
    local v
    v=$(curl -fs --max-time 5 "$GW/metrics" | awk -v m="$1" '$1 == m { print $2; exit }')
    echo "${v:-null}"
}
start_slow_mock() { # DELAY_MS: the slow mock on SLOW_PORT
    SLOW_PORT=$(free_port)
    "$MOCK" --listen "127.0.0.1:$SLOW_PORT" --delay-ms "$1" --threads 30000 >"$T/logs/mock-slow-$1.out" 2>/dev/null &
    SLOW_MOCK_PID=$!
    PIDS+=("$SLOW_MOCK_PID")
    wait_http "http://127.0.0.1:$SLOW_PORT/_health" 20 "$SLOW_MOCK_PID" || { log "the slow mock did not start"; exit 1; }
    sed -e "s#@MOCK_URL@#http://127.0.0.1:$SLOW_PORT#" -e "s#@PROFILES@#$REPO/deploy/providers#" \
        bench/idemgate.bench.json >"$T/gateway-slow.json"
}
if want slow; then
    start_slow_mock "$SLOW_DELAY"
    SLOW_NGINX_PORT=$(free_port)
    start_nginx nginx-slow "$SLOW_NGINX_PORT" "$SLOW_PORT"
    SLOW_NGINX_PID=$NGINX_PID
    saved_secs=$SECS saved_warm=$WARM
    # No warm-up: its 1 000 waiting connections, cut when it ends, would still be counted
    # against the per-address cap when the measured run connects (both rows ramp up alike).
    SECS=$SLOW_SECS WARM=0
    wrk_run slow_nginx unique.lua "http://127.0.0.1:$SLOW_NGINX_PORT/v1/images/generations" "" "" "$SLOW_CONNS"
    stop_pid "$SLOW_NGINX_PID"
    # The gateway as shipped: dispatch_workers, max_inflight_calls and call_threads at their
    # defaults (only the listener, the instance name and the archive folder are set).
    start_gateway slow 2 env IDEMGATE_CONFIG="$T/gateway-slow.json" IDEMGATE_DISPATCH_WORKERS=2
    ( sleep $((WARM + SLOW_SECS / 2))
      echo "{\"threads\":$(gw_threads "$GW_PID"),\"pg_connections\":$(pg_clients),\"calls_in_flight\":$(gw_metric idemgate_provider_calls_in_flight),\"rss_kib\":$(proc_kib "$GW_PID" VmRSS)}" >"$T/results/slow_sample.json"
    ) &
    sampler=$!
    wrk_run slow_e2e unique.lua "$GW$INTAKE_PATH" "wait=60" "" "$SLOW_CONNS"
    wait "$sampler" 2>/dev/null || true
    note slow "{\"delay_ms\":$SLOW_DELAY,\"connections\":$SLOW_CONNS,\"seconds\":$SLOW_SECS,\"gateway_mid_run\":$(cat "$T/results/slow_sample.json" 2>/dev/null || echo null),\"peak_rss_kib\":$(proc_kib "$GW_PID" VmHWM)}"
    SECS=$saved_secs WARM=$saved_warm
    stop_pid "$GW_PID"
    stop_pid "$SLOW_MOCK_PID"
fi
# Many calls in flight on one replica: INFL_N creates submitted without waiting, against a
# provider that answers each after INFL_DELAY ms; the gateway's calls in flight, memory, threads
# and PostgreSQL connections sampled while they wait, then every job's end.
if want inflight; then
    start_slow_mock "$INFL_DELAY"
    start_gateway inflight 2 env IDEMGATE_CONFIG="$T/gateway-slow.json" IDEMGATE_DISPATCH_WORKERS=2
    before=$(proc_kib "$GW_PID" VmRSS)
    t0=$(date +%s.%N)
    line=$(timeout 300 "$PY" bench/tools/submit_many.py "$GW$INTAKE_PATH" "$TOKEN" "$INFL_N" "bench-$NONCE-inflight" 2>"$T/logs/submit_many.err") || log "inflight: the submitter failed (see $T/logs/submit_many.err)"
    peak_calls=0 peak_rss=0 peak_threads=0 peak_pg=0
    deadline=$(( $(date +%s) + INFL_DELAY / 1000 ))
    while [ "$(date +%s)" -lt "$deadline" ]; do
        c=$(gw_metric idemgate_provider_calls_in_flight); c=${c%.*}; [ "$c" = null ] && c=0
        r=$(proc_kib "$GW_PID" VmRSS); th=$(gw_threads "$GW_PID"); pg=$(pg_clients)
        [ "$c" -gt "$peak_calls" ] && peak_calls=$c
        [ "$r" -gt "$peak_rss" ] && peak_rss=$r
        [ "$th" -gt "$peak_threads" ] && peak_threads=$th
        [ "$pg" -gt "$peak_pg" ] && peak_pg=$pg
        sleep 1
    done
    # Every job's end (bounded): the calls answer after INFL_DELAY ms.
    ended=0
    for _ in $(seq 120); do
        ended=$("${PSQL[@]}" -c "SELECT count(*) FROM operations WHERE idempotency_key LIKE 'bench-$NONCE-inflight-%' AND state IN ('completed', 'failed')")
        [ "$ended" -ge "$INFL_N" ] && break
        sleep 1
    done
    t1=$(date +%s.%N)
    states=$("${PSQL[@]}" -c "SELECT coalesce(json_object_agg(state, n), '{}') FROM (SELECT state, count(*) n FROM operations WHERE idempotency_key LIKE 'bench-$NONCE-inflight-%' GROUP BY state) s")
    creates=$(curl -fs --max-time 30 "http://127.0.0.1:$SLOW_PORT/_ledger" | "$PY" -c 'import json,sys; print(len(json.load(sys.stdin)["creates"]))' 2>/dev/null || echo null)
    note inflight "{\"calls\":$INFL_N,\"delay_ms\":$INFL_DELAY,\"submitter\":${line:-null},\"peak_calls_in_flight\":$(gw_metric idemgate_provider_calls_in_flight_peak | cut -d. -f1),\"sampled_calls_in_flight\":$peak_calls,\"rss_before_kib\":$before,\"peak_rss_kib\":$peak_rss,\"vmhwm_kib\":$(proc_kib "$GW_PID" VmHWM),\"peak_threads\":$peak_threads,\"peak_pg_connections\":$peak_pg,\"states\":$states,\"mock_creates\":$creates,\"seconds_to_all_ended\":$("$PY" -c "print(round($t1 - $t0, 1))")}"
    stop_pid "$GW_PID"
    stop_pid "$SLOW_MOCK_PID"
fi

# --- streams: STREAM_EVENTS-event chat completions (OpenAI's format) ------------------------
# nginx -> mock (proxy_buffering off) and the gateway live (new keys: each stream recorded as it
# is relayed), then the replay of one recorded stream; wrk counts whole streams. The first
# byte: STREAM_FB sequential requests of each, curl's time to the first byte, the median.
stream_first_byte() { # URL KEY_PREFIX: the median time to the first byte, ms
    local url=$1 prefix=$2 i
    for i in $(seq "$STREAM_FB"); do
        curl -s -o /dev/null --max-time 30 -w '%{time_starttransfer}\n' "$url" \
            -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
            -H "Idempotency-Key: $prefix-$i" -H 'Prefer: wait=30' --data-binary "$STREAM_BODY"
    done | sort -n | awk '{ v[NR] = $1 } END { printf "%.3f", 1000 * v[int((NR + 1) / 2)] }'
}
if want stream; then
    STREAM_BODY="{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,\"stream_options\":{\"include_usage\":true},\"_mock\":{\"events\":$STREAM_EVENTS}}"
    export BENCH_BODY=$STREAM_BODY
    wrk_run stream_nginx unique.lua "http://127.0.0.1:$NGINX_PORT/v1/chat/completions" ""
    start_gateway stream "$DISPATCH"
    wrk_run stream_live unique.lua "$GW/v1/providers/mock-chat/chat/completions" "wait=30"
    sample_rss stream_live
    curl -s -o /dev/null --max-time 30 "$GW/v1/providers/mock-chat/chat/completions" \
        -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
        -H "Idempotency-Key: bench-$NONCE-stream-replay" -H 'Prefer: wait=30' \
        --data-binary "$STREAM_BODY"
    wrk_run stream_replay reuse.lua "$GW/v1/providers/mock-chat/chat/completions" "wait=30" \
        "bench-$NONCE-stream-replay"
    fb_nginx=$(stream_first_byte "http://127.0.0.1:$NGINX_PORT/v1/chat/completions" "bench-$NONCE-fbn")
    fb_gw=$(stream_first_byte "$GW/v1/providers/mock-chat/chat/completions" "bench-$NONCE-fbg")
    # STREAM_MANY streams live at once, each STREAM_MANY_SECS long (events 250 ms apart): the
    # gateway's resident memory before, while they are all live, and after.
    many_events=$((STREAM_MANY_SECS * 4))
    export BENCH_BODY="{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,\"stream_options\":{\"include_usage\":true},\"_mock\":{\"events\":$many_events,\"event_delay_ms\":250}}"
    rss_before=$(proc_kib "$GW_PID" VmRSS)
    rounds=""
    saved_secs=$SECS saved_warm=$WARM
    SECS=$((STREAM_MANY_SECS + 4)) WARM=0
    # Two rounds: the first grows what stays (the job cache fills with the recorded answers),
    # the second shows whether live streams themselves leave anything behind.
    for round in 1 2; do
        ( sleep $((STREAM_MANY_SECS - 2))
          echo "{\"rss_kib\":$(proc_kib "$GW_PID" VmRSS),\"threads\":$(gw_threads "$GW_PID")}" >"$T/results/stream_many_mid.json"
        ) &
        sampler=$!
        wrk_run "stream_many_$round" unique.lua "$GW/v1/providers/mock-chat/chat/completions" "wait=60" "" "$STREAM_MANY"
        wait "$sampler" 2>/dev/null || true
        sleep 2
        rounds="$rounds${rounds:+,}{\"mid_run\":$(cat "$T/results/stream_many_mid.json" 2>/dev/null || echo null),\"rss_after_kib\":$(proc_kib "$GW_PID" VmRSS)}"
    done
    SECS=$saved_secs WARM=$saved_warm
    note stream_many "{\"connections\":$STREAM_MANY,\"events_per_stream\":$((many_events + 3)),\"seconds_per_stream\":$STREAM_MANY_SECS,\"rss_before_kib\":$rss_before,\"rounds\":[$rounds],\"vmhwm_kib\":$(proc_kib "$GW_PID" VmHWM)}"
    # role chunk, the deltas, the finish chunk, [DONE]
    note stream "{\"events_per_stream\":$((STREAM_EVENTS + 3)),\"first_byte_ms\":{\"nginx\":${fb_nginx:-null},\"gateway\":${fb_gw:-null}},\"first_byte_samples\":$STREAM_FB,\"peak_rss_kib\":$(proc_kib "$GW_PID" VmHWM)}"
    unset BENCH_BODY
    stop_pid "$GW_PID"
fi

# --- 3. intake alone, and the PostgreSQL ceiling ---------------------------------------------
# The intake path by itself: a replica with no dispatcher (dispatch_workers 0), so the wrk run
# and pgbench compete for the same two cores in the same way.
if want intake; then
    start_gateway intake 0
    wrk_run intake unique.lua "$GW$INTAKE_PATH" "wait=0"
    # One sequential client: the latency of one intent, against one fdatasync (pg_test_fsync).
    wrk_run intake_seq unique.lua "$GW$INTAKE_PATH" "wait=0" "" 1
    note gateway_intake_memory "{\"peak_rss_kib\":$(proc_kib "$GW_PID" VmHWM)}"
    stop_pid "$GW_PID"
fi

if want pgbench; then
    match=$("$PY" bench/tools/pgbench_sql.py check "$REPO" bench/intake.pgbench "$T/intake.pgbench" 2>"$T/logs/pgbench_sql.err") || match=unchecked
    case $match in
    match) note pgbench_script '{"matches_store_c":true}' ;;
    stale) log "bench/intake.pgbench no longer matches src/store.c: running the statement made from src/store.c"
           note pgbench_script '{"matches_store_c":false,"ran":"the statement made from src/store.c"}' ;;
    *) log "cannot compare bench/intake.pgbench with src/store.c (see $T/logs/pgbench_sql.err): running it as it is"
       cp bench/intake.pgbench "$T/intake.pgbench"
       note pgbench_script '{"matches_store_c":null}' ;;
    esac
    CANON='{"n":1,"prompt":"a lighthouse at dawn, watercolour","size":"1024x1024"}'
    mkdir -p "$T/pgbench"
    pgbench_run() { # NAME CLIENTS [SCRIPT]: a warm-up, then the measured run, per-transaction latencies
        local name=$1 clients=$2 script=${3:-$T/intake.pgbench} phase d
        for phase in warm run; do
            d=$SECS
            [ "$phase" = warm ] && d=$WARM
            [ "$d" -gt 0 ] || continue
            rm -f "$T"/pgbench/pgbench_log.*
            [ "$phase" = run ] && log "$name: pgbench -n -c $clients -j 2 -T $SECS -M prepared -f intake.pgbench"
            (cd "$T/pgbench" && timeout $((d + 60)) "$PGBENCH" -n -c "$clients" -j 2 -T "$d" -M prepared -l \
                -f "$script" -h "$PGDIR/sock" -p 5432 -U postgres \
                -D tenant="$TENANT_ID" -D fp="$(printf '%s' "$CANON" | sha256sum | cut -c1-64)" -D fpv=1 \
                -D provider=mock-images -D route=images/generations -D method=POST \
                -D url="http://127.0.0.1:$MOCK_PORT/v1/images/generations" \
                -D cred=IDEMGATE_BENCH_PROVIDER_KEY -D body="$CANON" -D ttl=168 -D strategy=none \
                -D outs=1 -D profile=openai-images idemgate >"$T/logs/$name-$phase.out" 2>&1) ||
                log "$name: pgbench failed (see $T/logs/$name-$phase.out)"
        done
        "$PY" bench/tools/pgbench_summary.py "$T/logs/$name-run.out" "$T/pgbench" "$clients" \
            >"$T/results/$name.json" || true
    }
    # The ceiling at the benchmark's concurrency, and at the gateway's own database concurrency
    # (one connection per server thread).
    pgbench_run pgbench "$CONNS"
    [ "$HTTP_THREADS" != "$CONNS" ] && pgbench_run pgbench_gw "$HTTP_THREADS"
    # The batched ceiling: BATCH_ROWS of the same statement per transaction (what a group commit
    # sends), at 4 clients; rows/s = its tps × BATCH_ROWS.
    BATCH_ROWS=32
    { sed -n '/^--/p' "$T/intake.pgbench"; echo "BEGIN;"
      for i in $(seq "$BATCH_ROWS"); do
          sed -e '/^--/d' -e 's/^\\set key /\\set key'"$i"' /' -e 's/^\\set jid /\\set jid'"$i"' /' \
              -e 's/:key\b/:key'"$i"'/g' -e 's/:jid\b/:jid'"$i"'/g' "$T/intake.pgbench"
      done
      echo "COMMIT;"; } >"$T/intake-batch.pgbench"
    pgbench_run pgbench_batch 4 "$T/intake-batch.pgbench"
    note pgbench_batch "{\"rows_per_transaction\":$BATCH_ROWS}"
    # The disk's own ceiling: one fdatasync, as PostgreSQL's pg_test_fsync measures it.
    if [ -x "$PGBIN/pg_test_fsync" ]; then
        "$PGBIN/pg_test_fsync" -s 2 -f "$PGDIR/fsync.test" >"$T/logs/pg_test_fsync.out" 2>&1 || true
        rate=$(awk '/fdatasync/ && /ops\/sec/ {print $(NF-3); exit}' "$T/logs/pg_test_fsync.out")
        [ -n "$rate" ] && note pg_test_fsync "{\"fdatasync_ops_per_sec\":$rate}"
        rm -f "$PGDIR/fsync.test"
    fi
fi

# --- 4. instructions per request under callgrind ---------------------------------------------
# One gateway under callgrind with no worker threads (dispatch, poll, reconcile, reaper: 0), so
# that only request handling runs. Its counters are zeroed after a warm-up and dumped after N
# sequential requests on one keep-alive connection; then zeroed again and dumped after the same
# wall time with no request: that idle cost (timers, LISTEN wake-ups) is subtracted.
if want callgrind && [ "$CG_N" -gt 0 ]; then
    mkdir -p "$T/callgrind"
    start_gateway callgrind 0 IDEMGATE_POLL_WORKERS=0 IDEMGATE_RECONCILE_WORKERS=0 \
        IDEMGATE_REAPER_INTERVAL_MS=0 \
        valgrind --tool=callgrind --dump-instr=no --callgrind-out-file="$T/callgrind/callgrind.out.%p"
    CG_PID=$GW_PID
    cg() { timeout 60 callgrind_control "$@" "$CG_PID" >/dev/null 2>&1; }
    seq_client() { timeout 900 "$PY" bench/tools/seq_client.py 127.0.0.1 "$GW_PORT" "$@"; }
    # The warm-up opens the writers' database connections and prepares their statements.
    seq_client unique 50 "$INTAKE_PATH" "$TOKEN" "bench-$NONCE-cgwarm" >/dev/null
    seq_client reuse 50 "$INTAKE_PATH" "$TOKEN" "$REPLAY_KEY" "wait=30" >/dev/null
    cg_total() { # PART-NAME: the Ir summary of that dump
        local f
        f=$(grep -l "^desc: Trigger: dump $1\$" "$T"/callgrind/callgrind.out.* | head -1)
        sed -n 's/^summary: //p' "$f"
    }
    cg_path() { # NAME MODE PREFER KEY [PATH]
        local name=$1 mode=$2 prefer=$3 key=$4 path=${5:-$INTAKE_PATH} line secs
        cg -z
        line=$(seq_client "$mode" "$CG_N" "$path" "$TOKEN" "$key" "$prefer")
        cg -d "$name"
        secs=$(echo "$line" | awk '{print $4}')
        cg -z
        sleep "$secs"
        cg -d "$name-idle"
        log "callgrind $name: $line"
        note "callgrind_$name" "{\"requests\":$CG_N,\"client\":\"$line\",\"seconds\":$secs,\"ir\":$(cg_total "$name"),\"idle_ir\":$(cg_total "$name-idle")}"
    }
    cg_path intake unique "wait=0" "bench-$NONCE-cg"
    # The replayed key and the job read are only complete when section 2 made them (it ran).
    if [ -n "${JOB_ID:-}" ]; then
        cg_path replay reuse "wait=30" "$REPLAY_KEY"
        cg_path get get "" "" "/v1/jobs/$JOB_ID"
    else
        log "callgrind: replay and get skipped (no completed job: run it with e2e, replay or get)"
    fi
    stop_pid "$CG_PID"
    # Where the instructions went, per request (bench/tools/cg_top.py; the raw dumps stay in the
    # temporary directory with BENCH_KEEP=1, for callgrind_annotate or kcachegrind).
    for part in intake replay get; do
        f=$(grep -l "^desc: Trigger: dump $part\$" "$T"/callgrind/callgrind.out.* | head -1)
        [ -n "$f" ] || continue
        cp "$f" "$T/callgrind/$part.callgrind.out"
        "$PY" bench/tools/cg_top.py "$f" "$CG_N" 30 >"$T/callgrind/profile-$part.txt" || true
        "$PY" bench/tools/cg_top.py --json "$f" "$CG_N" 15 >"$T/results/profile-$part.json" || true
    done
fi

# --- 5. the cost of history -------------------------------------------------------------------
# HIST_N completed operations of the same tenant stored in bulk (every index in place), then the
# intake run of section 3 again: what a key lookup and an insert cost with a large table. Their
# ids are spread over the whole range of the gateway's ids (26 characters of its alphabet, every
# other one), as a history of random ids is: sequential ones left every new id's index entry
# beside the others, and hid what a random id costs there.
# Stores N rows in TABLE in chunks of a million: SQL is an INSERT … SELECT over
# generate_series({FROM}, {TO}) g. Then vacuums and analyses the table, notes its size as KEY
# (WHAT: the rows' name), and measures intake once more as RUN on a fresh gateway.
seed_and_measure() { # KEY TABLE WHAT N RUN SQL
    local key=$1 table=$2 what=$3 n=$4 run=$5 sql=$6 from to t0 q stored size
    log "history: storing $n $what"
    t0=$(date +%s)
    for ((from = 1; from <= n; from += 1000000)); do
        to=$((from + 999999))
        [ "$to" -le "$n" ] || to=$n
        q=${sql//\{FROM\}/$from}
        "${PSQL[@]}" -c "${q//\{TO\}/$to}" >/dev/null || { log "history: the bulk insert of $what failed"; break; }
    done
    "${PSQL[@]}" -c "VACUUM ANALYZE $table" -c "CHECKPOINT" >/dev/null
    stored=$("${PSQL[@]}" -c "SELECT count(*) FROM $table")
    size=$("${PSQL[@]}" -c "SELECT pg_total_relation_size('$table')")
    note "$key" "{\"rows_seeded\":$n,\"$what\":$stored,\"bytes\":$size,\"seconds\":$(( $(date +%s) - t0 ))}"
    log "history: $stored $what ($((size / 1048576)) MiB with indexes) in $(( $(date +%s) - t0 )) s"
    start_gateway "$key" 0
    wrk_run "$run" unique.lua "$GW$INTAKE_PATH" "wait=0"
    stop_pid "$GW_PID"
}

if want history && [ "$HIST_N" -gt 0 ]; then
    seed_and_measure history operations operations "$HIST_N" intake_hist \
        "INSERT INTO operations (tenant_id, id, idempotency_key, fingerprint,
              fingerprint_version, provider, route, req_method, req_url, req_credential, req_body,
              state, resp_status, resp_body, created_at, updated_at, first_sent_at, finished_at,
              expires_at)
            SELECT t.id, 'job_' || substr(translate(md5(g::text), '0123456789abcdef',
                   '246acegikmoqsuwy'), 1, 26), 'history-' || g, sha256(int8send(g)),
                   1, 'mock-images', 'images/generations', 'POST',
                   'http://127.0.0.1:$MOCK_PORT/v1/images/generations', 'IDEMGATE_BENCH_PROVIDER_KEY',
                   convert_to(json_build_object('n', 1, 'prompt', 'history ' || g)::text, 'UTF8'),
                   'completed', 200,
                   convert_to(json_build_object('created', 1, 'data',
                       json_build_array(json_build_object('url', 'http://x/' || g || '.png')))::text,
                       'UTF8'),
                   now() - interval '1 day', now(), now(), now(), now() + interval '6 days'
            FROM generate_series({FROM}, {TO}) g, tenants t WHERE t.id = $TENANT_ID"
    # Then TOMB_N tombstones of the same tenant (keys whose jobs retention deleted, migration
    # 0032; kept 30 days) and the same intake run again: every new key is probed in them. Their
    # keys are shaped as the run's own (bench-…), so each probe lands on a leaf of its own, as a
    # new key among 30 days of old ones does.
    [ "$TOMB_N" -le 0 ] || seed_and_measure tombstones key_tombstones tombstones "$TOMB_N" \
        intake_tomb \
        "INSERT INTO key_tombstones (tenant_id, idempotency_key, fingerprint,
              fingerprint_version, provider, route, job_id, state, written_at, expires_at)
            SELECT t.id, 'bench-' || md5(g::text), sha256(int8send(g)), 1, 'mock-images',
                   'images/generations', 'job_' || substr(translate(md5('t' || g),
                   '0123456789abcdef', '246acegikmoqsuwy'), 1, 26), 'completed',
                   now() - interval '1 day', now() + interval '29 days'
            FROM generate_series({FROM}, {TO}) g, tenants t WHERE t.id = $TENANT_ID"
fi

# --- report ----------------------------------------------------------------------------------
mkdir -p "$(dirname "$OUT")"
"$PY" bench/tools/report.py "$T" "$OUT" \
    "{\"seconds\":$SECS,\"warmup_seconds\":$WARM,\"connections\":$CONNS,\"wide_connections\":$WIDE_CONNS,\"http_threads\":$HTTP_THREADS,\"dispatch_workers\":$DISPATCH,\"idle_connections\":$IDLE_N,\"callgrind_requests\":$CG_N,\"history_rows\":$HIST_N,\"tombstone_rows\":$TOMB_N,\"slow_delay_ms\":$SLOW_DELAY,\"slow_connections\":$SLOW_CONNS,\"slow_seconds\":$SLOW_SECS,\"stream_events\":$STREAM_EVENTS}"
for part in intake replay get; do
    [ -s "$T/callgrind/profile-$part.txt" ] && cp "$T/callgrind/profile-$part.txt" "$(dirname "$OUT")/"
done
log "wrote $OUT"
