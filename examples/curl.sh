#!/usr/bin/env bash
# Generate one product poster through idemgate — bash, curl and coreutils only.
#
# The Idempotency-Key is derived from the identity of the output (see KEYS.md): running this
# twice, or from another process, machine or language with the same identity, yields the same
# job and at most one paid creation at the provider.
#
#   IDEMGATE_TOKEN=... examples/curl.sh --product sku-123 --template-version 3 \
#       --prompt-version 2 --language de --aspect-ratio 16:9 --variant 1
#
# Options and exit status are those of python_client.py: 0 completed · 1 failed · 2 not
# retryable · 3 key reused with other parameters (422, never retried) · 4 gave up for now.
# stdout: one JSON line {"key", "job_id", "state", "replayed", "outputs"}; progress on stderr.
set -euo pipefail

url=${IDEMGATE_URL:-http://127.0.0.1:8080}
route=mock-images/images/generations
product="" template_version=1 source="" prompt_version=1 language=en aspect_ratio=1:1
variant=1 prompt_override="" have_override=0 wait=10 deadline=120 max_attempts=8

log() { printf 'curl.sh: %s\n' "$*" >&2; }
usage() { log "$*"; exit 2; }
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || usage "option $1 needs a value"
    case "$1" in
    --url) url=$2 ;;
    --route) route=$2 ;;
    --product) product=$2 ;;
    --template-version) template_version=$2 ;;
    --source) source=$2 ;;
    --prompt-version) prompt_version=$2 ;;
    --language) language=$2 ;;
    --aspect-ratio) aspect_ratio=$2 ;;
    --variant) variant=$2 ;;
    --prompt-override) prompt_override=$2; have_override=1 ;;
    --wait) wait=$2 ;;
    --deadline) deadline=$2 ;;
    --max-attempts) max_attempts=$2 ;;
    *) usage "unknown option $1" ;;
    esac
    shift 2
done

[ -n "${IDEMGATE_TOKEN:-}" ] || usage "IDEMGATE_TOKEN is not set"
[[ $product =~ ^[A-Za-z0-9._-]{1,64}$ ]] || usage "--product must be [A-Za-z0-9._-]{1,64}"
[[ $language =~ ^[A-Za-z-]{2,16}$ ]] || usage "--language must be a language tag"
for n in "$template_version" "$prompt_version" "$variant" "$wait" "$deadline" "$max_attempts"; do
    [[ $n =~ ^[0-9]+$ ]] || usage "numeric options take integers"
done
case "$aspect_ratio" in
1:1) size=1024x1024 ;; 16:9) size=1792x1024 ;; 9:16) size=1024x1792 ;;
*) usage "--aspect-ratio must be 1:1, 16:9 or 9:16" ;;
esac
source_sha256=none
if [ -n "$source" ]; then source_sha256=$(sha256sum <"$source" | cut -d' ' -f1); fi

# The key names the output, so it is stable across retries, restarts and languages. Every input
# that changes the output is in it; nothing else is (no time, no random).
identity=$(printf 'purpose=poster\nproduct_id=%s\ntemplate_version=%s\nsource_sha256=%s\nprompt_version=%s\nlanguage=%s\naspect_ratio=%s\nvariant=%s\n' \
    "$product" "$template_version" "$source_sha256" "$prompt_version" "$language" "$aspect_ratio" "$variant"; echo .)
identity=${identity%.}
key="poster-$product-$(printf '%s' "$identity" | sha256sum | cut -c1-32)"

if [ "$have_override" = 1 ]; then
    prompt=$prompt_override
else
    prompt="Studio poster for product $product, layout template v$template_version, copy in $language, variant $variant (prompt v$prompt_version)"
fi
case "$prompt" in *[[:cntrl:]]*) usage "the prompt may not hold control characters" ;; esac
prompt_json=${prompt//\\/\\\\}
prompt_json=${prompt_json//\"/\\\"}
body="{\"prompt\":\"$prompt_json\",\"n\":1,\"size\":\"$size\",\"user\":\"product:$product\"}"
base=${url%/}
end=$((SECONDS + deadline))
log "key $key"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The token goes to curl through a header file, never on its command line (visible in ps).
printf 'Authorization: Bearer %s\n' "$IDEMGATE_TOKEN" >"$tmp/auth"

# request METHOD PATH [curl args…]: sets $status (000 on a transport error), $tmp/h and $tmp/b.
request() {
    local method=$1 path=$2
    shift 2
    status=$(curl -sS -X "$method" -o "$tmp/b" -D "$tmp/h" -w '%{http_code}' \
        -H @"$tmp/auth" -H 'Accept: application/json' "$@" "$base$path" 2>"$tmp/err") || true
    [ -n "$status" ] || status=000
}
header() { grep -i "^$1:" "$tmp/h" | tail -n1 | cut -d: -f2- | tr -d '\r' | sed 's/^ *//' || true; }
json_str() { grep -o "\"$1\":\"[^\"]*\"" "$tmp/b" | head -n1 | cut -d'"' -f4 || true; }
problem() { echo "$status $(json_str type | sed 's/.*://'): $(json_str detail)"; }
retry_after() {
    local v
    v=$(header Retry-After)
    if [[ $v =~ ^[0-9]+$ ]]; then
        ((v < 1)) && v=1
        ((v > 300)) && v=300  # at least what the gateway asked (the deadline bounds it)
        echo "$v"
    else echo 2; fi
}
outputs() { grep -o '"url":"[^"]*"' "$tmp/b" | cut -d'"' -f4 | sed 's/.*/"&"/' | paste -sd, - || true; }
summary() { # STATE JOB_ID REPLAYED OUTPUTS EXIT
    local job=null
    [ -n "$2" ] && job="\"$2\""
    printf '{"key":"%s","job_id":%s,"state":"%s","replayed":%s,"outputs":[%s]}\n' \
        "$key" "$job" "$1" "$3" "$4"
    exit "$5"
}
sleep_until_retry() { # SECONDS WHAT: false when the deadline has passed
    local left=$((end - SECONDS)) s=$1
    ((left > 0)) || return 1
    ((s > left)) && s=$left
    log "$2; retrying in ${s}s with the same key"
    sleep "$s"
}

# 1. Submit until the gateway has a durable answer. Retrying is safe: same key, same body.
job_id="" replayed=false attempt=0
while ((attempt < max_attempts)); do
    attempt=$((attempt + 1))
    request POST "/v1/providers/$route" --max-time $((wait + 20)) \
        -H 'Content-Type: application/json' -H "Idempotency-Key: $key" \
        -H "Prefer: wait=$wait" --data-binary "$body"
    if [ "$status" = 000 ]; then # refused, reset, timed out: the same key makes a resend safe
        backoff=$((2 ** attempt)); ((backoff > 10)) && backoff=10
        sleep_until_retry "$backoff" "submit: $(tr -d '\n' <"$tmp/err")" || break
        continue
    fi
    [ "$(header Idempotent-Replayed)" = true ] && replayed=true || replayed=false
    passthrough_id=$(header X-Idemgate-Job-Id)
    if [ -n "$passthrough_id" ]; then # Prefer: wait → the provider's own answer
        state=$(header X-Idemgate-State)
        [ "$state" = completed ] && summary "$state" "$passthrough_id" "$replayed" "$(outputs)" 0
        log "the provider answered $status: the job is $state"
        summary "$state" "$passthrough_id" "$replayed" "" 1
    fi
    case "$status" in
    200 | 202) job_id=$(json_str id); break ;;
    422)
        log "submit: $(problem)"
        log "this key already names a request with other parameters: a new intended output needs a new identity (bump --prompt-version); not retrying"
        summary rejected "" false "" 3 ;;
    429 | 5??)
        sleep_until_retry "$(retry_after)" "submit: $(problem)" || break
        continue ;;
    *)
        log "submit: $(problem); not retrying"
        summary rejected "" false "" 2 ;;
    esac
done
if [ -z "$job_id" ]; then
    log "gave up submitting; run again later: the same identity resumes the same job"
    summary unsubmitted "" false "" 4
fi

# 2. Poll the job until it is terminal.
state=$(json_str state)
log "job $job_id is $state$([ "$replayed" = true ] && echo ' (replayed)')"
delay=1
while ! grep -q '"terminal":true' "$tmp/b"; do
    if ((SECONDS + delay > end)); then
        log "job $job_id is still $state; run again later to resume it"
        summary "$state" "$job_id" "$replayed" "" 4
    fi
    sleep "$delay"
    delay=$((delay * 2)); ((delay > 5)) && delay=5
    request GET "/v1/jobs/$job_id" --max-time 20
    case "$status" in
    200) state=$(json_str state) ;;
    000) log "poll: $(tr -d '\n' <"$tmp/err")"; echo '{}' >"$tmp/b" ;;
    429 | 5??) delay=$(retry_after); log "poll: $(problem)"; echo '{}' >"$tmp/b" ;;
    *) log "poll: $(problem); not retrying"; summary unknown "$job_id" "$replayed" "" 2 ;;
    esac
done
if [ "$state" = completed ]; then summary completed "$job_id" "$replayed" "$(outputs)" 0; fi
log "job $job_id failed: $(json_str last_error)"
summary "$state" "$job_id" "$replayed" "" 1
