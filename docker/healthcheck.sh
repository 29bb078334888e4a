#!/bin/bash
# idemgate-healthcheck [PATH [HOST:PORT]]
#
# A dependency-free HTTP probe for the container's HEALTHCHECK, Compose healthchecks and
# Kubernetes exec probes: bash's /dev/tcp, no curl in the image. Exits 0 when
# `GET PATH` on HOST:PORT answers 200 within IDEMGATE_HEALTHCHECK_TIMEOUT seconds (default 2),
# 1 otherwise.
#
#   PATH       /healthz (liveness, the default) or /readyz (readiness: database and schema)
#   HOST:PORT  defaults to IDEMGATE_LISTEN, then 127.0.0.1:8080; a wildcard host (0.0.0.0)
#              is probed on 127.0.0.1, so the probe works whatever interface the API is on.
set -u
path=${1:-/healthz}
listen=${2:-${IDEMGATE_LISTEN:-127.0.0.1:8080}}
host=${listen%:*}
port=${listen##*:}
case "$host" in "" | 0.0.0.0 | "*") host=127.0.0.1 ;; esac
case "$port" in '' | *[!0-9]*) echo "idemgate-healthcheck: bad HOST:PORT '$listen'" >&2; exit 1 ;; esac
case "$path" in /*) ;; *) echo "idemgate-healthcheck: PATH must start with /" >&2; exit 1 ;; esac

# shellcheck disable=SC2016 # the inner script expands its own positional parameters
exec timeout "${IDEMGATE_HEALTHCHECK_TIMEOUT:-2}" bash -c '
    exec 3<>"/dev/tcp/$1/$2" || exit 1
    printf "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" "$3" "$1" >&3
    IFS=" " read -r _ status _ <&3 || exit 1
    [ "$status" = 200 ]
' idemgate-healthcheck "$host" "$port" "$path"
