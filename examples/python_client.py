#!/usr/bin/env python3
"""Generate one product poster through idemgate — Python, standard library only.

The Idempotency-Key is derived from the identity of the output (see KEYS.md): running this
twice, or from another process, machine or language with the same identity, yields the same
job and at most one paid creation at the provider.

    IDEMGATE_TOKEN=... python3 examples/python_client.py --product sku-123 \
        --template-version 3 --prompt-version 2 --language de --aspect-ratio 16:9 --variant 1

Environment: IDEMGATE_TOKEN (required; never pass secrets on the command line),
IDEMGATE_URL (default http://127.0.0.1:8080).

stdout: one JSON line {"key", "job_id", "state", "replayed", "outputs"}; progress on stderr.
Exit status: 0 completed · 1 the provider refused, or the job failed or was canceled · 2 a
request this client must not retry (bad token, unknown route, invalid input) · 3 the key is
already bound to different parameters (422: a bug in the caller, never retried) · 4 gave up for
now (deadline or attempts exhausted: run it again later, with the same identity it resumes the
same job).
"""

import argparse
import hashlib
import http.client
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request

EXIT_OK, EXIT_FAILED, EXIT_CLIENT, EXIT_KEY_REUSED, EXIT_GAVE_UP = 0, 1, 2, 3, 4
SIZES = {"1:1": "1024x1024", "16:9": "1792x1024", "9:16": "1024x1792"}


def log(msg):
    print(f"python_client: {msg}", file=sys.stderr, flush=True)


def derive_key(product, template_version, source_sha256, prompt_version, language,
               aspect_ratio, variant):
    """The key names the output, so it is stable across retries, restarts and languages.
    Every input that changes the output is in it; nothing else is (no time, no random)."""
    identity = (f"purpose=poster\nproduct_id={product}\ntemplate_version={template_version}\n"
                f"source_sha256={source_sha256}\nprompt_version={prompt_version}\n"
                f"language={language}\naspect_ratio={aspect_ratio}\nvariant={variant}\n")
    return f"poster-{product}-" + hashlib.sha256(identity.encode()).hexdigest()[:32]


def render_prompt(product, template_version, prompt_version, language, variant):
    return (f"Studio poster for product {product}, layout template v{template_version}, "
            f"copy in {language}, variant {variant} (prompt v{prompt_version})")


class Answer:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = {k.lower(): v for k, v in headers.items()}
        self.body = body

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return {}


def call(method, url, token, body=None, headers=None, timeout=30):
    h = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    h.update(headers or {})
    data = None
    if body is not None:
        data = body.encode()
        h["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return Answer(r.status, dict(r.headers), r.read())
    except urllib.error.HTTPError as e:
        return Answer(e.code, dict(e.headers), e.read())


def retry_after(answer, default=2):
    v = answer.headers.get("retry-after", "")
    return max(1, min(int(v), 300)) if v.isdigit() else default  # at least what was asked


def problem(answer):
    j = answer.json()
    return f"{answer.status} {j.get('type', '').rsplit(':', 1)[-1]}: {j.get('detail', '')}"


def outputs_of(provider_body):
    data = provider_body.get("data") if isinstance(provider_body, dict) else None
    return [d["url"] for d in data or [] if isinstance(d, dict) and "url" in d]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=os.environ.get("IDEMGATE_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--route", default="mock-images/images/generations")
    ap.add_argument("--product", required=True)
    ap.add_argument("--template-version", type=int, default=1)
    ap.add_argument("--source", help="source asset file; its SHA-256 is part of the identity")
    ap.add_argument("--prompt-version", type=int, default=1)
    ap.add_argument("--language", default="en")
    ap.add_argument("--aspect-ratio", default="1:1", choices=sorted(SIZES))
    ap.add_argument("--variant", type=int, default=1)
    ap.add_argument("--prompt-override",
                    help="send this prompt instead of the template's, keeping the identity: "
                         "what editing a prompt without bumping --prompt-version does (422)")
    ap.add_argument("--wait", type=int, default=10, help="Prefer: wait=N seconds per request")
    ap.add_argument("--deadline", type=float, default=120, help="give up after N seconds")
    ap.add_argument("--max-attempts", type=int, default=8, help="submissions at most")
    a = ap.parse_args()

    token = os.environ.get("IDEMGATE_TOKEN")
    if not token:
        log("IDEMGATE_TOKEN is not set")
        return EXIT_CLIENT
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", a.product) or \
            not re.fullmatch(r"[A-Za-z-]{2,16}", a.language):
        log("--product must be [A-Za-z0-9._-]{1,64} and --language a language tag")
        return EXIT_CLIENT
    source_sha = "none"
    if a.source:
        with open(a.source, "rb") as f:
            source_sha = hashlib.sha256(f.read()).hexdigest()

    key = derive_key(a.product, a.template_version, source_sha, a.prompt_version, a.language,
                     a.aspect_ratio, a.variant)
    prompt = a.prompt_override if a.prompt_override is not None else render_prompt(
        a.product, a.template_version, a.prompt_version, a.language, a.variant)
    body = json.dumps({"prompt": prompt, "n": 1, "size": SIZES[a.aspect_ratio],
                       "user": f"product:{a.product}"})
    base = a.url.rstrip("/")
    deadline = time.monotonic() + a.deadline
    log(f"key {key}")

    def summary(state, job_id, replayed, outputs, code):
        print(json.dumps({"key": key, "job_id": job_id, "state": state, "replayed": replayed,
                          "outputs": outputs}), flush=True)
        return code

    def sleep_until_retry(seconds, what):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        log(f"{what}; retrying in {min(seconds, left):.0f}s with the same key")
        time.sleep(min(seconds, left))
        return True

    # 1. Submit until the gateway has a durable answer. Retrying is safe: same key, same body.
    job, replayed = None, False
    for attempt in range(1, a.max_attempts + 1):
        try:
            r = call("POST", f"{base}/v1/providers/{a.route}", token, body,
                     {"Idempotency-Key": key, "Prefer": f"wait={a.wait}"}, timeout=a.wait + 20)
        except (OSError, http.client.HTTPException) as e:
            # Refused, reset, timed out: the same key makes a resend safe.
            if not sleep_until_retry(min(2 ** attempt, 10), f"submit: {e}"):
                break
            continue
        replayed = r.headers.get("idempotent-replayed") == "true"
        if "x-idemgate-job-id" in r.headers:  # Prefer: wait → the provider's own answer
            job_id, state = r.headers["x-idemgate-job-id"], r.headers["x-idemgate-state"]
            if state == "completed":
                return summary(state, job_id, replayed, outputs_of(r.json()), EXIT_OK)
            log(f"the provider answered {r.status}: the job is {state}")
            return summary(state, job_id, replayed, [], EXIT_FAILED)
        if r.status in (200, 202):
            job = r.json()
            break
        if r.status == 422:
            log(f"submit: {problem(r)}")
            log("this key already names a request with other parameters: a new intended "
                "output needs a new identity (bump --prompt-version); not retrying")
            return summary("rejected", None, False, [], EXIT_KEY_REUSED)
        if r.status in (429, 503) or r.status >= 500:
            if not sleep_until_retry(retry_after(r), f"submit: {problem(r)}"):
                break
            continue
        log(f"submit: {problem(r)}; not retrying")
        return summary("rejected", None, False, [], EXIT_CLIENT)
    if job is None:
        log("gave up submitting; run again later: the same identity resumes the same job")
        return summary("unsubmitted", None, False, [], EXIT_GAVE_UP)

    # 2. Poll the job until it is terminal.
    job_id, delay = job["id"], 0.5
    log(f"job {job_id} is {job['state']}{' (replayed)' if replayed else ''}")
    while not job.get("terminal"):
        if time.monotonic() + delay > deadline:
            log(f"job {job_id} is still {job['state']}; run again later to resume it")
            return summary(job["state"], job_id, replayed, [], EXIT_GAVE_UP)
        time.sleep(delay)
        delay = min(delay * 2, 5)
        try:
            r = call("GET", f"{base}/v1/jobs/{job_id}", token, timeout=20)
        except (OSError, http.client.HTTPException) as e:
            log(f"poll: {e}")
            continue
        if r.status == 200:
            job = r.json()
        elif r.status in (429, 503) or r.status >= 500:
            delay = retry_after(r)
            log(f"poll: {problem(r)}")
        else:
            log(f"poll: {problem(r)}; not retrying")
            return summary("unknown", job_id, replayed, [], EXIT_CLIENT)
    result = job.get("result") or {}
    if job["state"] == "completed":
        return summary("completed", job_id, replayed, outputs_of(result.get("body")), EXIT_OK)
    log(f"job {job_id} ended {job['state']}: {job.get('last_error')} "
        f"(provider status {result.get('status')})")
    return summary(job["state"], job_id, replayed, [], EXIT_FAILED)


if __name__ == "__main__":
    sys.exit(main())
