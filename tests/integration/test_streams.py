"""Streamed LLM text (issue 25 §1–3): OpenAI Chat Completions and Anthropic Messages through the
shipped profiles, at the mock. A streamed answer is recorded whole and a retry with the same key
and body gets the identical event sequence with `Idempotent-Replayed: true`, without a second
create; its usage settles the cost by the token prices. A stream that ends without its terminal
event (cut, or an error event) was generated and paid for: the job is `unknown`, never resent."""

import json
import os
import re
import time
import uuid

import pytest

from conftest import ROOT

PROFILES = os.path.join(ROOT, "deploy", "providers")
ENV = {"OPENAI_API_KEY": "sk-test-chat", "ANTHROPIC_API_KEY": "sk-ant-test"}


def entries(mock):
    sfx = uuid.uuid4().hex[:6]
    chat = {"name": "chat" + sfx, "profile": os.path.join(PROFILES, "openai-chat.json"),
            "base_url": mock.url, "timeouts": {"connect_ms": 1000, "total_ms": 8000},
            "retry": {"max_attempts": 3, "deadline_seconds": 60, "base_ms": 50, "cap_ms": 200}}
    claude = {"name": "claude" + sfx, "profile": os.path.join(PROFILES, "anthropic-messages.json"),
              "base_url": mock.url, "timeouts": {"connect_ms": 1000, "total_ms": 8000},
              "retry": {"max_attempts": 3, "deadline_seconds": 60, "base_ms": 50, "cap_ms": 200,
                        "not_created_statuses": [408, 425, 429, 529]}}
    return [chat, claude], chat["name"] + "/chat/completions", claude["name"] + "/messages"


def chat_body(stream=True, **mock):
    b = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Say hello"}]}
    if stream:
        b.update(stream=True, stream_options={"include_usage": True})
    if mock:
        b["_mock"] = mock
    return b


def claude_body(stream=True, **mock):
    b = {"model": "claude-sonnet-4-20250514", "max_tokens": 64,
         "messages": [{"role": "user", "content": "Say hello"}]}
    if stream:
        b["stream"] = True
    if mock:
        b["_mock"] = mock
    return b


def sequence_numbers(text):
    """The sequence_number of every Responses event in text, in order."""
    return [int(m) for m in re.findall(rb'"sequence_number":(\d+)', text)]


def creates(mock, path):
    return [c for c in mock.ledger() if c["route"] == path and not c["replay"]]


def first_batch_kept(psql, job_id, bound_s=20):
    """Waits (at most bound_s) until the first batch of job_id's stream is kept on its row, the
    row still `sending`: a second or so into the stream."""
    deadline = time.monotonic() + bound_s
    while True:
        kept = psql(f"SELECT coalesce(length(resp_body), 0), state FROM operations "
                    f"WHERE id = '{job_id}'")[0]
        if int(kept[0]) > 0:
            break
        assert time.monotonic() < deadline, kept
        time.sleep(0.05)
    assert kept[1] == "sending", kept


def responses_entry(mock, name, **extra):
    """A provider entry of the shipped OpenAI Responses profile, at the mock."""
    return dict({"name": name, "profile": os.path.join(PROFILES, "openai-responses.json"),
                 "base_url": mock.url, "timeouts": {"connect_ms": 1000, "total_ms": 8000}},
                **extra)


def test_a_streamed_chat_is_recorded_and_replayed_identically(gateway_factory, mock, token):
    providers, chat, _ = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    r = gw.submit(token, "chat-1", chat_body(events=5), route=chat, headers={"Prefer": "wait=20"})
    assert r.status == 200, r
    assert r.headers["content-type"].startswith("text/event-stream")
    text = r.body.decode()
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    assert text.count('"content":"tok') == 5
    job_id = r.headers["x-idemgate-job-id"]
    assert len(creates(mock, "/v1/chat/completions")) == 1

    again = gw.submit(token, "chat-1", chat_body(events=5), route=chat,
                      headers={"Prefer": "wait=20"})
    assert again.status == 200, again
    assert again.headers.get("idempotent-replayed") == "true"
    assert again.body == r.body  # byte for byte
    assert len(creates(mock, "/v1/chat/completions")) == 1

    # The usage the last chunk reported settles the cost: gpt-4o-mini's token prices.
    j = gw.job(token, job_id).json()
    assert j["state"] == "completed", j
    usage = j["usage"]
    assert usage["completion_tokens"] == 5, usage
    want = round(usage["prompt_tokens"] * 0.15 + usage["completion_tokens"] * 0.60)
    assert abs(j["cost"]["micros"] - want) <= 1, (j["cost"], usage)


def test_a_long_record_is_stored_compressed_with_lz4(gateway_factory, mock, token, psql):
    """A stream's record is stored out of line compressed with lz4 (migration 0024), not pglz,
    and replayed byte for byte from it."""
    providers, chat, _ = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    key = "lz4-" + uuid.uuid4().hex[:8]
    r = gw.submit(token, key, chat_body(events=300), route=chat, headers={"Prefer": "wait=20"})
    assert r.status == 200, r
    assert len(r.body) > 8000, len(r.body)  # long enough to be stored out of line
    job_id = r.headers["x-idemgate-job-id"]
    assert psql(f"SELECT pg_column_compression(resp_body) FROM operations "
                f"WHERE id = '{job_id}'") == [["lz4"]]
    # Another replica has nothing of it in memory: the replay is read from the stored record.
    other = gateway_factory(providers=providers, env=ENV)
    again = other.submit(token, key, chat_body(events=300), route=chat,
                         headers={"Prefer": "wait=20"})
    assert again.headers.get("idempotent-replayed") == "true"
    assert again.body == r.body


def test_a_record_over_the_result_batch_bound_is_committed_whole(gateway_factory, mock, token):
    """A stream of ~9 MB: spooled while it runs, past the 8 MiB a batch of results holds (its
    result commits on its own, src/dispatcher.c), past the batches kept while it runs — recorded
    whole, replayed byte for byte by another replica, one create."""
    providers, chat, _ = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    key = "huge-" + uuid.uuid4().hex[:8]
    body = chat_body(events=60000)
    r = gw.submit(token, key, body, route=chat, headers={"Prefer": "wait=60"}, timeout=60)
    assert r.status == 200 and len(r.body) > 8 * 1024 * 1024, (r.status, len(r.body))
    assert r.body.endswith(b"data: [DONE]\n\n")
    j = gw.job(token, r.headers["x-idemgate-job-id"]).json()
    assert j["state"] == "completed" and j["usage"]["completion_tokens"] == 60000, j
    other = gateway_factory(providers=providers, env=ENV)
    again = other.submit(token, key, body, route=chat, headers={"Prefer": "wait=60"}, timeout=60)
    assert again.headers.get("idempotent-replayed") == "true"
    assert again.body == r.body
    assert len(creates(mock, "/v1/chat/completions")) == 1


def cache_bytes(gw):
    m = re.search(rb"^idemgate_job_cache_bytes (\d+)$", gw.http.request("GET", "/metrics").body,
                  re.M)
    return int(m.group(1))


def test_the_job_cache_holds_no_record_larger_than_its_share(gateway_factory, mock, token):
    """job_cache_bytes bounds what the terminal-job cache holds: a stream's record larger than a
    sixteenth of it is not held (its replays read the database, byte for byte the same); a short
    one is held."""
    providers, chat, _ = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV, job_cache_bytes=65536)
    assert cache_bytes(gw) == 0
    key = "big-" + uuid.uuid4().hex[:8]
    r = gw.submit(token, key, chat_body(events=300), route=chat, headers={"Prefer": "wait=20"})
    assert r.status == 200 and len(r.body) > 65536 // 16, (r.status, len(r.body))
    again = gw.submit(token, key, chat_body(events=300), route=chat, headers={"Prefer": "wait=20"})
    assert again.headers.get("idempotent-replayed") == "true"
    assert again.body == r.body
    assert cache_bytes(gw) < 65536 // 16  # the long record is not in it
    small = "small-" + uuid.uuid4().hex[:8]
    r = gw.submit(token, small, chat_body(events=3), route=chat, headers={"Prefer": "wait=20"})
    assert r.status == 200 and len(r.body) < 65536 // 16, (r.status, len(r.body))
    again = gw.submit(token, small, chat_body(events=3), route=chat, headers={"Prefer": "wait=20"})
    assert again.body == r.body
    assert len(r.body) < cache_bytes(gw) <= 65536  # the short one is (with its job's document)
    assert len(creates(mock, "/v1/chat/completions")) == 2


def test_an_anthropic_stream_is_recorded_and_replayed(gateway_factory, mock, token):
    providers, _, claude = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    r = gw.submit(token, "claude-1", claude_body(events=4), route=claude,
                  headers={"Prefer": "wait=20"})
    assert r.status == 200, r
    text = r.body.decode()
    assert text.startswith("event: message_start\n") and "event: message_stop\n" in text, text
    again = gw.submit(token, "claude-1", claude_body(events=4), route=claude,
                      headers={"Prefer": "wait=20"})
    assert again.body == r.body and again.headers.get("idempotent-replayed") == "true"
    [create] = creates(mock, "/v1/messages")
    assert create["status"] == 200, create  # the mock refuses a create without anthropic-version
    j = gw.job(token, r.headers["x-idemgate-job-id"]).json()
    assert j["usage"]["output_tokens"] == 4 and j["usage"]["input_tokens"] > 0, j["usage"]
    # Reserved: the profile's 1 000 input tokens and the request's max_tokens (64) of output at
    # $3/M and $15/M; settled by the usage the events reported.
    assert j["cost"]["estimate_micros"] == 1000 * 3 + 64 * 15, j["cost"]
    want = j["usage"]["input_tokens"] * 3 + j["usage"]["output_tokens"] * 15
    assert abs(j["cost"]["micros"] - want) <= 1, (j["cost"], j["usage"])
    # A request without "stream" is another request: the provider's whole answer, its own job.
    whole = gw.submit(token, "claude-2", claude_body(stream=False), route=claude,
                      headers={"Prefer": "wait=20"})
    assert whole.status == 200 and whole.json()["type"] == "message", whole


def wait_state(gw, token, job_id, states, timeout=20):
    return gw.wait_state(token, job_id, states, timeout=timeout)


def test_a_stream_without_its_terminal_event_is_unknown_and_never_resent(gateway_factory, mock,
                                                                          token):
    providers, chat, claude = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    cases = [
        (chat, "/v1/chat/completions", chat_body(events=6, cut_after=3)),   # connection cut
        (chat, "/v1/chat/completions", chat_body(events=6, error_after=2)),  # error chunk
        # reasoning generated (and billed), then a 429 chunk: output before the error, not a
        # refusal that made nothing (it was backed off and sent again)
        (chat, "/v1/chat/completions", chat_body(events=6, error_after=3, reasoning=True,
                                                 error_code="rate_limit_exceeded")),
        (claude, "/v1/messages", claude_body(events=6, cut_after=4)),
        (claude, "/v1/messages", claude_body(events=6, error_after=4)),      # overloaded_error
    ]
    for route, path, body in cases:
        key = "cut-" + uuid.uuid4().hex
        before = len(creates(mock, path))
        r = gw.submit(token, key, body, route=route, headers={"Prefer": "respond-async"})
        assert r.status == 202, r
        job_id = r.json()["id"]
        j = wait_state(gw, token, job_id, ("unknown", "review", "completed", "failed"))
        assert j["state"] in ("unknown", "review"), (body["_mock"], j)
        # The same key again: the job as it is, nothing sent.
        again = gw.submit(token, key, body, route=route, headers={"Prefer": "respond-async"})
        assert again.status == 202 and again.json()["id"] == job_id, again
        time.sleep(0.5)
        assert len(creates(mock, path)) == before + 1, (body["_mock"], creates(mock, path))


def test_a_stream_cut_after_its_output_keeps_its_id_and_refuses_absent(gateway_factory, mock,
                                                                       token):
    """A Chat Completions or Messages stream cut after it carried output: generated and billed,
    and these profiles cannot read the generation back by its id. The job goes to review at the
    window's end — and a tenant's `absent` sent it again, a second paid generation, since
    nothing on the row named the one made. Now the id the stream named (chatcmpl-…, msg_…) is
    kept as the job's remote id: `absent` is refused, 409 task-known. A stream refused before
    any output names nothing and is backed off and sent again as before."""
    providers, chat, claude = entries(mock)
    for e in providers:
        e["reconcile"] = {"strategy": "none", "window_seconds": 1}
    gw = gateway_factory(providers=providers, env=ENV)
    for route, path, body, prefix in [
            (chat, "/v1/chat/completions", chat_body(events=6, cut_after=3), "chatcmpl-"),
            (claude, "/v1/messages", claude_body(events=6, error_after=4), "msg_")]:
        before = len(creates(mock, path))
        r = gw.submit(token, "cutid-" + uuid.uuid4().hex, body, route=route,
                      headers={"Prefer": "respond-async"})
        assert r.status == 202, r
        job_id = r.json()["id"]
        j = wait_state(gw, token, job_id, ("review", "completed", "failed"))
        assert j["state"] == "review" and (j["remote_id"] or "").startswith(prefix), j
        a = gw.http.request("POST", f"/v1/jobs/{job_id}/resolve",
                            json.dumps({"outcome": "absent"}),
                            {"Authorization": f"Bearer {token}"})
        assert a.status == 409 and a.json()["type"].endswith("task-known"), a
        time.sleep(0.5)  # a dispatcher would have claimed a prepared job by now
        assert len(creates(mock, path)) == before + 1, creates(mock, path)


def test_a_whole_stream_whose_connection_then_broke_is_completed(gateway_factory, mock, token):
    """The provider sent the whole stream, its terminal event included, then closed the
    connection without the chunked body's last chunk (curl: a partial file). The answer is
    whole: completed with it, its live client ends cleanly — never unknown, then review, for a
    paid answer the gateway holds entire."""
    providers, chat, claude = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    for route, path, body, end in [
            (chat, "/v1/chat/completions", chat_body(events=3, unterminated=True),
             "data: [DONE]\n\n"),
            (claude, "/v1/messages", claude_body(events=3, unterminated=True),
             'event: message_stop\ndata: {"type":"message_stop"}\n\n')]:
        key = "unterminated-" + uuid.uuid4().hex
        before = len(creates(mock, path))
        live = Live(gw, token, route, key, body, wait=10)
        cut = live.rest_or_cut()
        assert not cut and live.data.decode().endswith(end), live.data[-200:]
        r = gw.submit(token, key, body, route=route, headers={"Prefer": "respond-async"})
        j = wait_state(gw, token, r.json()["id"], ("completed", "unknown", "review", "failed"))
        assert j["state"] == "completed", j
        replay = gw.submit(token, key, body, route=route, headers={"Prefer": "wait=10"})
        assert replay.status == 200 and replay.body.decode().endswith(end), replay.body[-200:]
        assert len(creates(mock, path)) == before + 1


def test_a_refusal_before_the_first_event_backs_off_and_streams_after(gateway_factory, mock,
                                                                      token):
    providers, _, claude = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    key = "overloaded-" + uuid.uuid4().hex
    body = claude_body(events=2)
    # The first create is refused with 529 (scripted by the body would repeat; a 529 then a
    # success needs two bodies): here the status control answers every create, so the job
    # backs off until its attempts run out and is then failed, nothing generated.
    body["_mock"] = {"status": 529}
    r = gw.submit(token, key, body, route=claude, headers={"Prefer": "respond-async"})
    j = wait_state(gw, token, r.json()["id"], ("failed", "completed", "unknown", "review"))
    assert j["state"] == "failed", j
    assert all(c["replay"] for c in mock.ledger() if c["route"] == "/v1/messages")


def test_an_error_event_before_any_output_is_judged_as_its_status(gateway_factory, mock, token):
    """Issue 25 §3: an error event mid-stream is classified like a status. Before any output
    (right after message_start, or OpenAI's role chunk) nothing was generated: Anthropic's
    overloaded_error is a 529, which the profile lists as not created, so the job backs off and
    the next create streams whole; OpenAI's server_error is a 500, which may have made
    something: the job is in doubt and never resent. After output, any error leaves the stream
    cut (test above)."""
    providers, chat, claude = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    nonce = uuid.uuid4().hex
    body = claude_body(events=3, error_first=1)
    body["messages"][0]["content"] = "overloaded once " + nonce
    r = gw.submit(token, "err-claude-" + nonce, body, route=claude,
                  headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    j = wait_state(gw, token, r.json()["id"], ("completed", "failed", "unknown", "review"))
    assert j["state"] == "completed", j
    made = [c for c in creates(mock, "/v1/messages")
            if c["body_sha256"] == creates(mock, "/v1/messages")[-1]["body_sha256"]]
    assert len(made) == 2, made  # the refused create and the whole one
    replay = gw.submit(token, "err-claude-" + nonce, body, route=claude,
                       headers={"Prefer": "wait=10"})
    text = replay.body.decode()
    assert replay.status == 200 and text.endswith(
        'event: message_stop\ndata: {"type":"message_stop"}\n\n'), text[-200:]
    assert "overloaded_error" not in text  # the record is the whole stream, not the refusal

    body = chat_body(events=3, error_first=1)
    body["messages"][0]["content"] = "server error once " + nonce
    before = len(creates(mock, "/v1/chat/completions"))
    r = gw.submit(token, "err-chat-" + nonce, body, route=chat,
                  headers={"Prefer": "respond-async"})
    j = wait_state(gw, token, r.json()["id"], ("completed", "failed", "unknown", "review"))
    assert j["state"] in ("unknown", "review"), j
    assert "error event server_error before any output (as HTTP 500)" in j["last_error"], j
    time.sleep(0.5)
    assert len(creates(mock, "/v1/chat/completions")) == before + 1

    # A Responses stream named its response before the error event: the generation may go on
    # at the provider, so the event's type decides nothing — it is read back (here: failed),
    # never sent again.
    resp = responses_entry(mock, "rerr" + nonce[:6])
    gw2 = gateway_factory(providers=[resp], env=ENV)
    body = {"model": "gpt-4o-mini", "input": "error once " + nonce, "stream": True,
            "_mock": {"events": 3, "error_first": 1}}
    r = gw2.submit(token, "err-resp-" + nonce, body, route=resp["name"] + "/responses",
                   headers={"Prefer": "respond-async"})
    j = wait_state(gw2, token, r.json()["id"], ("completed", "failed", "review"), timeout=30)
    assert j["state"] == "failed" and j["remote_id"].startswith("resp_"), j
    assert len(creates(mock, "/v1/responses")) == 1
    # Prefer: wait on it: the job failed — a 502 with the job's headers, never the read
    # response's 200.
    again = gw2.submit(token, "err-resp-" + nonce, body, route=resp["name"] + "/responses",
                       headers={"Prefer": "wait=5"})
    assert again.status == 502 and again.headers["x-idemgate-state"] == "failed", again


def test_a_live_client_never_sees_the_refusal_its_job_backs_off_from(gateway_factory, mock,
                                                                    token):
    """A streamed create refused in its stream before any output (Anthropic's overloaded_error
    after message_start: a 529, listed as not created): the job backs off and is sent again.
    Before, the client reading it live was shown the refusal (200, message_start, the error
    event, then a cut) while the gateway sent the request again and paid for the answer — a
    client that believed it and retried under a new key paid twice. Now nothing is shown
    before output: for its client the refused stream never began, and it waits for the job —
    the resend's whole answer, one paid create and the refused one."""
    providers, _, claude = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    nonce = uuid.uuid4().hex
    body = claude_body(events=3, error_first=1)
    body["messages"][0]["content"] = "overloaded once, read live " + nonce
    live = Live(gw, token, claude, "refused-live-" + nonce, body, wait=20)
    status = live.resp.status
    cut = live.rest_or_cut()
    text = live.data.decode()
    assert status == 200, (status, text[-300:])
    assert "overloaded_error" not in text, text[-400:]
    assert not cut and text.endswith(
        'event: message_stop\ndata: {"type":"message_stop"}\n\n'), (cut, text[-300:])
    sha = creates(mock, "/v1/messages")[-1]["body_sha256"]
    made = [c for c in creates(mock, "/v1/messages") if c["body_sha256"] == sha]
    assert len(made) == 2, made  # the refused create and the whole one


def test_a_resend_claimed_before_the_first_attempt_closed_its_stream_keeps_its_own(
        gateway_factory, mock, token):
    """A streamed create refused after its first event (Anthropic's overloaded_error: a 529, not
    created) backs off, due at once; its result committed, another dispatcher claims the resend
    before the first attempt has closed its live stream (a pause point holds it there). The
    resend attached to that ended stream: its bytes were dropped and the first attempt's refusal
    read back as its record — a third create, for a whole answer already paid for. It keeps its
    own body now: two creates, completed with the second's stream."""
    providers, _, claude = entries(mock)
    for e in providers:
        e["retry"].update(base_ms=1, cap_ms=5)
    gw = gateway_factory(providers=providers,
                         env=dict(ENV, IDEMGATE_PAUSE="after_result_commit:700"),
                         dispatch_workers=3)
    nonce = uuid.uuid4().hex
    body = claude_body(events=3, error_first=1)
    body["messages"][0]["content"] = "overloaded once, resent at once " + nonce
    # Its client reads the first attempt's stream live: the refusal is never shown (nothing
    # before output is), and the client waits for the job (the replay below checks the record).
    live = Live(gw, token, claude, "resend-live-" + nonce, body, wait=10)
    live.rest_or_cut()
    deadline = time.time() + 10
    while '"event":"pause_point"' not in gw.log() and time.time() < deadline:
        time.sleep(0.05)
    assert '"event":"pause_point"' in gw.log(), gw.log()[-2000:]
    time.sleep(1.5)
    sha = creates(mock, "/v1/messages")[-1]["body_sha256"]
    made = [c for c in creates(mock, "/v1/messages") if c["body_sha256"] == sha]
    assert len(made) == 2, made  # the refused create and the whole one, never a third
    replay = gw.submit(token, "resend-live-" + nonce, body, route=claude,
                       headers={"Prefer": "wait=10"})
    text = replay.body.decode()
    assert replay.status == 200 and text.endswith(
        'event: message_stop\ndata: {"type":"message_stop"}\n\n'), text[-300:]
    assert "overloaded_error" not in text


class Live:
    """A streamed request read as it arrives (http.client decodes the chunks)."""

    def __init__(self, gw, token, route, key, body, wait=30):
        import http.client
        self.conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
        self.conn.request("POST", f"/v1/providers/{route}", json.dumps(body),
                          {"Authorization": f"Bearer {token}", "Idempotency-Key": key,
                           "Content-Type": "application/json", "Prefer": f"wait={wait}"})
        self.resp = self.conn.getresponse()
        self.data = b""

    def until(self, marker):
        """Reads until marker is in what arrived (or the body ended); returns it all."""
        while marker not in self.data:
            piece = self.resp.read1(65536)
            if not piece:
                break
            self.data += piece
        return self.data

    def rest(self):
        self.data += self.resp.read()
        return self.data

    def rest_or_cut(self):
        """Reads to the end and closes; True when the body never ended (the stream was cut)."""
        import http.client
        try:
            self.rest()
            cut = False
        except http.client.IncompleteRead as e:
            self.data += e.partial
            cut = True
        self.close()
        return cut

    def close(self):
        self.conn.close()


def live_streams(gw):
    m = re.search(rb"^idemgate_live_streams (\d+)$", gw.http.request("GET", "/metrics").body, re.M)
    return int(m.group(1))


def test_a_streamed_wait_whose_stream_never_began_ends_with_the_job(gateway_factory, mock,
                                                                    token):
    """`"stream": true` with `Prefer: wait=2` while the provider sends no event for 4 s: the wait
    ends with the job, 202, still sending — answered at its deadline (before, a second after it:
    a difference no assertion here measures)."""
    providers, chat, _ = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    r = gw.submit(token, "late-" + uuid.uuid4().hex, chat_body(events=1, event_delay_ms=4000),
                  route=chat, headers={"Prefer": "wait=2"})
    assert r.status == 202 and r.json()["state"] == "sending", r


def test_a_stream_that_began_is_the_answer_past_the_wait(gateway_factory, mock, token):
    """`Prefer: wait=1`, the provider's first event (the role chunk) at once, its first output
    3 s later (a model that thinks): the stream began within the wait, so it is the answer —
    nothing is shown before output, and the wait's deadline no longer applies (a 202 there
    would turn a client that asked for a stream into one polling a job)."""
    providers, chat, _ = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    body = chat_body(events=2, output_delay_ms=3000)
    body["messages"][0]["content"] = "think first " + uuid.uuid4().hex
    live = Live(gw, token, chat, "think-" + uuid.uuid4().hex, body, wait=1)
    status = live.resp.status
    cut = live.rest_or_cut()
    assert status == 200 and not cut, (status, live.data[-300:])
    assert live.data.decode().endswith("data: [DONE]\n\n"), live.data[-300:]


def test_the_first_client_gets_each_event_as_it_arrives(gateway_factory, mock, token):
    providers, chat, _ = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    body = chat_body(events=4, event_delay_ms=700)
    live = Live(gw, token, chat, "live-1", body)
    assert live.resp.status == 200
    assert live.resp.getheader("Content-Type").startswith("text/event-stream")
    job_id = live.resp.getheader("X-Idemgate-Job-Id")
    first = live.until(b"\n\n")
    assert first.startswith(b"data: {") and b'"role":"assistant"' in first, first
    # The first event is here while the provider is still generating: the job is not done.
    assert gw.job(token, job_id).json()["state"] == "sending"
    assert live_streams(gw) == 1
    whole = live.rest()
    live.close()
    assert whole.endswith(b"data: [DONE]\n\n"), whole[-100:]
    assert wait_state(gw, token, job_id, ("completed",))["state"] == "completed"
    assert live_streams(gw) == 0  # closed once its record was written: nothing left behind
    replay = gw.submit(token, "live-1", body, route=chat, headers={"Prefer": "wait=5"})
    assert replay.body == whole and replay.headers.get("idempotent-replayed") == "true"
    assert len(creates(mock, "/v1/chat/completions")) == 1


def test_a_second_request_joins_the_live_stream(gateway_factory, mock, token):
    providers, _, claude = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    body = claude_body(events=4, event_delay_ms=500)
    first = Live(gw, token, claude, "join-1", body)
    first.until(b"content_block_delta")  # live, mid-stream
    second = Live(gw, token, claude, "join-1", body)
    assert second.resp.status == 200
    assert second.resp.getheader("Idempotent-Replayed") == "true"
    assert second.resp.getheader("X-Idemgate-Job-Id") == first.resp.getheader("X-Idemgate-Job-Id")
    a, b = first.rest(), second.rest()
    first.close()
    second.close()
    assert a == b, (a[-80:], b[-80:])  # every event so far, then the rest live: the same bytes
    assert a.endswith(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
    assert len(creates(mock, "/v1/messages")) == 1


def spooled(gw):
    m = re.search(rb"^idemgate_live_streams_spooled (\d+)$",
                  gw.http.request("GET", "/metrics").body, re.M)
    return int(m.group(1))


def open_files(pid):
    """What each of the process's descriptors names, skipping those closed while they are read
    (the gateway's threads open and close sockets meanwhile: a listed descriptor gone before its
    readlink failed the test on a slow machine)."""
    names = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            names.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            pass
    return names


def test_a_long_live_stream_is_spooled_not_held_in_memory(gateway_factory, mock, token, tmp_path):
    """A live stream longer than stream_memory_bytes moves to an unlinked file in
    stream_spool_dir (memory keeps only the event being received): its first client and a client
    joining it get every byte, the record is whole, and the file is gone with the stream. The
    folder by default: archive_dir's tmp, made on first use."""
    spool = tmp_path / "archive" / "tmp"  # gateway_factory's archive_dir
    providers, chat, _ = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV, stream_memory_bytes=2048)
    body = chat_body(events=40, event_delay_ms=100)
    first = Live(gw, token, chat, "spool-1", body)
    first.until(b'"tok25 "')  # ~4 KB in: past the memory share
    assert spooled(gw) == 1
    fds = open_files(gw.proc.pid)
    assert any(t.startswith(str(spool)) and t.endswith("(deleted)") for t in fds), fds
    assert os.listdir(spool) == []  # nobody else sees it
    second = Live(gw, token, chat, "spool-1", body)  # joins: every event so far read back
    assert second.resp.status == 200
    assert second.resp.getheader("Idempotent-Replayed") == "true"
    a, b = first.rest(), second.rest()
    first.close()
    second.close()
    assert a == b, (len(a), len(b))
    assert a.endswith(b"data: [DONE]\n\n") and a.count(b'"content":"tok') == 40
    assert spooled(gw) == 0
    fds = open_files(gw.proc.pid)
    assert not any(t.startswith(str(spool)) for t in fds), fds
    # The record is the stream: another replica replays it from the database, byte for byte.
    other = gateway_factory(providers=providers, env=ENV)
    again = other.submit(token, "spool-1", body, route=chat, headers={"Prefer": "wait=20"})
    assert again.headers.get("idempotent-replayed") == "true"
    assert again.body == a
    assert len(creates(mock, "/v1/chat/completions")) == 1


def test_a_client_that_leaves_mid_stream_does_not_stop_the_recording(gateway_factory, mock,
                                                                      token):
    providers, chat, _ = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    body = chat_body(events=5, event_delay_ms=300)
    live = Live(gw, token, chat, "leave-1", body)
    job_id = live.resp.getheader("X-Idemgate-Job-Id")
    live.until(b"tok0")
    live.close()  # the client goes; the provider goes on generating, and we go on paying
    j = wait_state(gw, token, job_id, ("completed", "unknown", "failed"))
    assert j["state"] == "completed", j
    replay = gw.submit(token, "leave-1", body, route=chat, headers={"Prefer": "wait=5"})
    assert replay.status == 200 and replay.body.endswith(b"data: [DONE]\n\n"), replay
    assert replay.body.count(b'"content":"tok') == 5
    assert len(creates(mock, "/v1/chat/completions")) == 1


def test_a_client_reset_during_the_intent_commit_does_not_stop_the_recording(
        gateway_factory, mock, token, psql):
    """The client's connection is reset while its intent is being committed (slowed here by a
    trigger): the job was born claimed and its call goes on, so its stream is recorded whole —
    the request's end must not end the recording its call feeds. The retry replays it."""
    import socket
    import struct
    providers, chat, _ = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    key = "reset-" + uuid.uuid4().hex[:8]
    fn = "slow_commit_" + uuid.uuid4().hex[:8]
    psql(f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
         f"IF NEW.idempotency_key = '{key}' THEN PERFORM pg_sleep(1.5); END IF; "
         "RETURN NEW; END $$")
    psql(f"CREATE TRIGGER {fn} BEFORE INSERT ON operations FOR EACH ROW EXECUTE FUNCTION {fn}()")
    body = json.dumps(chat_body(events=5, event_delay_ms=100)).encode()
    try:
        s = socket.create_connection(("127.0.0.1", gw.port))
        s.sendall(f"POST /v1/providers/{chat} HTTP/1.1\r\nHost: x\r\n"
                  f"Authorization: Bearer {token}\r\nIdempotency-Key: {key}\r\n"
                  f"Content-Type: application/json\r\nPrefer: wait=20\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(0.5)  # the intent is in its commit now
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # a reset, not an orderly close
        time.sleep(2.5)  # the commit returns; the call streams to nobody
    finally:
        psql(f"DROP TRIGGER {fn} ON operations")
        psql(f"DROP FUNCTION {fn}()")
    r = gw.submit(token, key, chat_body(events=5, event_delay_ms=100), route=chat,
                  headers={"Prefer": "wait=20"})
    assert r.status == 200 and r.body.endswith(b"data: [DONE]\n\n"), (r.status, r.body[-300:])
    assert r.body.count(b'"content":"tok') == 5
    assert r.headers.get("idempotent-replayed") == "true"
    j = gw.job(token, r.headers["x-idemgate-job-id"]).json()
    assert j["state"] == "completed", j
    assert len(creates(mock, "/v1/chat/completions")) == 1


def test_a_client_gone_while_the_provider_pauses_frees_its_wait_slot(gateway_factory, mock,
                                                                      token):
    """A live reader whose client left while the provider pauses between events (a reasoning
    model may think for minutes) is ended within about a second, not at the next event: its
    tenant's wait slot (here the only one) is free for another request long before the stream
    moves again. The recording goes on, and the retry replays it."""
    providers, chat, _ = entries(mock)
    providers[0]["timeouts"]["total_ms"] = 30000
    gw = gateway_factory(providers=providers, env=ENV, tenant_wait_connections=1,
                         lease_seconds=40)
    body = chat_body(events=2, event_delay_ms=4000)
    live = Live(gw, token, chat, "gone-1", body)
    job_id = live.resp.getheader("X-Idemgate-Job-Id")
    live.until(b"tok0")  # the first token; the next event is 4 s away
    live.conn.sock.shutdown(2)
    live.close()
    time.sleep(2.0)  # past the sweep's check (each second), before the next event
    other = gw.submit(token, "gone-other-" + uuid.uuid4().hex[:6], chat_body(stream=False),
                      route=chat, headers={"Prefer": "wait=1"})
    assert other.status != 429, (other.status, other.body[:300])
    j = wait_state(gw, token, job_id, ("completed", "unknown", "failed"), timeout=30)
    assert j["state"] == "completed", j
    replay = gw.submit(token, "gone-1", body, route=chat, headers={"Prefer": "wait=5"})
    assert replay.status == 200 and replay.body.endswith(b"data: [DONE]\n\n"), replay
    assert len(creates(mock, "/v1/chat/completions")) == 2


def test_a_cut_stream_cuts_the_live_client_too(gateway_factory, mock, token):
    providers, chat, _ = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    live = Live(gw, token, chat, "cut-live", chat_body(events=6, event_delay_ms=100, cut_after=3))
    job_id = live.resp.getheader("X-Idemgate-Job-Id")
    assert live.rest_or_cut()  # the body never ended: the client knows the stream was cut
    assert live.data.count(b"\n\n") == 3 and b"[DONE]" not in live.data, live.data
    assert wait_state(gw, token, job_id, ("unknown", "review"))["state"] in ("unknown", "review")


def http10_post(gw, token, route, key, body, wait=20):
    """An HTTP/1.0 request: (status line, headers, the body its Content-Length gives)."""
    from test_request_limits import raw
    data = json.dumps(body).encode()
    head = (f"POST /v1/providers/{route} HTTP/1.0\r\nAuthorization: Bearer {token}\r\n"
            f"Idempotency-Key: {key}\r\nContent-Type: application/json\r\n"
            f"Prefer: wait={wait}\r\nContent-Length: {len(data)}\r\n\r\n")
    return raw(gw.port, head.encode() + data)


def test_an_http10_client_gets_the_record_never_a_live_stream(gateway_factory, mock, token):
    """HTTP/1.0 has no chunked body: a body of unknown length ends with the connection, so a cut
    would look like an end. Such a client is not relayed the live stream: it gets the record
    (a whole stream, its length known) or, for a cut one, the job in doubt."""
    providers, chat, _ = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    status, headers, body = http10_post(gw, token, chat, "h10-cut",
                                        chat_body(events=6, event_delay_ms=50, cut_after=3),
                                        wait=3)
    assert " 200 " not in status + " " and "text/event-stream" not in headers.get(
        "content-type", ""), (status, headers, body[:300])
    assert json.loads(body)["state"] in ("unknown", "review", "sending"), body[:300]
    status, headers, body = http10_post(gw, token, chat, "h10-whole", chat_body(events=4))
    assert " 200" in status and headers["content-type"].startswith("text/event-stream"), status
    assert int(headers["content-length"]) == len(body) and body.endswith(b"data: [DONE]\n\n")
    assert body.count(b'"content":"tok') == 4
    # The same key while it streams to an HTTP/1.1 client: the HTTP/1.0 one does not join the
    # live body; it waits for the record.
    live = Live(gw, token, chat, "h10-join", chat_body(events=6, event_delay_ms=250))
    live.until(b"tok0")
    status, headers, body = http10_post(gw, token, chat, "h10-join",
                                        chat_body(events=6, event_delay_ms=250))
    assert " 200" in status and headers.get("idempotent-replayed") == "true", (status, headers)
    assert int(headers["content-length"]) == len(body) and body.endswith(b"data: [DONE]\n\n")
    assert live.rest() == body
    assert len(creates(mock, "/v1/chat/completions")) == 3


def test_kill_9_mid_stream_leaves_the_job_in_doubt_never_resent(gateway_factory, mock, token):
    providers, chat, _ = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    body = chat_body(events=6, event_delay_ms=250)
    live = Live(gw, token, chat, "kill-1", body)
    job_id = live.resp.getheader("X-Idemgate-Job-Id")
    live.until(b"tok0")
    gw.proc.kill()  # mid-stream: the provider generates on, the answer is lost
    gw.proc.wait()
    live.close()
    other = gateway_factory(providers=providers, env=ENV)
    # The lease runs out (10 s in these tests): sent, no answer recorded, a provider that cannot
    # be asked: in doubt, for an operator; never sent again.
    j = wait_state(other, token, job_id, ("unknown", "review", "completed", "failed"), timeout=40)
    assert j["state"] in ("unknown", "review"), j
    again = other.submit(token, "kill-1", body, route=chat, headers={"Prefer": "respond-async"})
    assert again.status == 202 and again.json()["id"] == job_id, again
    assert len(creates(mock, "/v1/chat/completions")) == 1


def test_kill_9_mid_chat_stream_refuses_absent(gateway_factory, mock, token, psql):
    """A Chat Completions stream whose replica dies after part of it was kept on the row: the
    reaper makes the job unknown, the window (strategy none) sends it to review — with no remote
    id (only a cut the dispatcher writes itself keeps the stream's id) and no 2xx create
    attempt on record. A tenant's `absent` was applied and the dispatcher sent the create again:
    a second paid generation. The stream's record kept on the row is the proof now: 409
    task-known, one create."""
    providers, chat, _ = entries(mock)
    for e in providers:
        e["reconcile"] = {"strategy": "none", "window_seconds": 1}
    gw = gateway_factory(providers=providers, env=ENV)
    before = len(creates(mock, "/v1/chat/completions"))
    body = chat_body(events=30, event_delay_ms=300)
    r = gw.submit(token, "k9abs-" + uuid.uuid4().hex, body, route=chat,
                  headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    job_id = r.json()["id"]
    first_batch_kept(psql, job_id)
    gw.proc.kill()
    gw.proc.wait()
    other = gateway_factory(providers=providers, env=ENV)
    j = wait_state(other, token, job_id, ("review", "completed", "failed"), timeout=40)
    assert j["state"] == "review" and not j["remote_id"], j
    a = other.http.request("POST", f"/v1/jobs/{job_id}/resolve", json.dumps({"outcome": "absent"}),
                           {"Authorization": f"Bearer {token}"})
    assert a.status == 409 and a.json()["type"].endswith("task-known"), (a, other.log()[-3000:])
    assert "event stream" in a.json()["detail"], a
    time.sleep(1.5)  # a dispatcher would have claimed a prepared job by now
    assert len(creates(mock, "/v1/chat/completions")) == before + 1


def test_a_stale_born_reservation_does_not_cut_a_later_attempts_stream(gateway_factory, mock,
                                                                      token):
    """A streamed request's born reservation waits in a dispatcher thread held past its lease
    (pause point before its send begins, 13 s; the lease is 10 s): another dispatcher thread
    claims the job, attaches its live stream and streams the whole answer to the waiting client.
    The held thread then finds the row no longer its own — and closed the job's live stream by
    its id, the running attempt's: every later byte was dropped, the whole stream recorded as
    cut (unknown, then review), the client cut mid-answer. Only the attempt that feeds a stream
    ends it now: the client reads the whole answer, the job is completed, one create."""
    providers, chat, _ = entries(mock)
    gw = gateway_factory(providers=providers,
                         env=dict(ENV, IDEMGATE_PAUSE="before_begin_send:13000"))
    before = len(creates(mock, "/v1/chat/completions"))
    live = Live(gw, token, chat, "stale-born-" + uuid.uuid4().hex,
                chat_body(events=25, event_delay_ms=250), wait=60)  # ~10-17 s
    job_id = live.resp.getheader("X-Idemgate-Job-Id")
    cut = live.rest_or_cut()
    assert '"event":"pause_point"' in gw.log()
    j = wait_state(gw, token, job_id, ("completed", "unknown", "review", "failed"), timeout=40)
    assert not cut and j["state"] == "completed", (cut, j["state"], gw.log()[-2000:])
    assert b"[DONE]" in live.data, live.data[-300:]
    assert len(creates(mock, "/v1/chat/completions")) == before + 1


def test_a_stream_in_progress_at_sigterm_is_recorded_before_exit(gateway_factory, mock, token):
    import signal
    providers, chat, _ = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    body = chat_body(events=5, event_delay_ms=300)
    live = Live(gw, token, chat, "term-1", body)
    job_id = live.resp.getheader("X-Idemgate-Job-Id")
    live.until(b"tok0")
    gw.proc.send_signal(signal.SIGTERM)
    assert gw.proc.wait(timeout=30) == 0, gw.log()[-2000:]
    live.close()
    other = gateway_factory(providers=providers, env=ENV)
    j = other.job(token, job_id).json()
    assert j["state"] == "completed", j  # the call was let end and recorded
    replay = other.submit(token, "term-1", body, route=chat, headers={"Prefer": "wait=5"})
    assert replay.body.endswith(b"data: [DONE]\n\n") and replay.body.count(b'"content":"tok') == 5
    assert len(creates(mock, "/v1/chat/completions")) == 1


def test_one_job_served_streamed_or_whole_as_each_client_asks(gateway_factory, mock, token):
    """"stream" chooses the delivery, not the generation: the same key asked streamed and whole is
    one job, one create; each client gets the record the way it asked (a recorded stream
    assembled into the provider's whole answer, a whole answer as its events)."""
    providers, chat, claude = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    streamed = gw.submit(token, "both-1", chat_body(events=3), route=chat,
                         headers={"Prefer": "wait=20"})
    assert streamed.headers["content-type"].startswith("text/event-stream"), streamed
    whole = gw.submit(token, "both-1", chat_body(stream=False, events=3), route=chat,
                      headers={"Prefer": "wait=20"})
    assert whole.status == 200 and whole.headers["content-type"].startswith("application/json")
    assert whole.headers.get("idempotent-replayed") == "true"
    w = whole.json()
    assert w["object"] == "chat.completion", w
    assert w["choices"][0]["message"] == {"role": "assistant", "content": "tok0 tok1 tok2 "}, w
    assert w["choices"][0]["finish_reason"] == "stop" and w["usage"]["completion_tokens"] == 3
    assert len(creates(mock, "/v1/chat/completions")) == 1

    # The other way round, at Anthropic: asked whole first, then streamed.
    first = gw.submit(token, "both-2", claude_body(stream=False, events=2), route=claude,
                      headers={"Prefer": "wait=20"})
    assert first.json()["content"] == [{"type": "text", "text": "tok0 tok1 "}], first
    events = gw.submit(token, "both-2", claude_body(events=2), route=claude,
                       headers={"Prefer": "wait=20"})
    assert events.headers["content-type"].startswith("text/event-stream"), events
    text = events.body.decode()
    assert text.startswith("event: message_start\n") and text.endswith(
        'event: message_stop\ndata: {"type":"message_stop"}\n\n'), text
    assert '"text":"tok0 tok1 "' in text and '"stop_reason":"end_turn"' in text, text
    assert len(creates(mock, "/v1/messages")) == 1
    # Anything else that differs is another request.
    other = gw.submit(token, "both-2", dict(claude_body(events=2), max_tokens=65), route=claude)
    assert other.status == 422, other


def test_a_stream_that_does_not_begin_within_the_wait_is_answered_with_the_job(gateway_factory,
                                                                              mock, token):
    """Prefer: wait holds for a stream too: a provider that sends its first event after the
    wait leaves the client the job (202), which it polls or asks again for the record."""
    providers, chat, _ = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    # The first event 1.5 s after the answer began, the whole stream in 6 s (the profile's
    # timeout is 8 s here).
    body = chat_body(events=1, event_delay_ms=1500)
    r = gw.submit(token, "late-1", body, route=chat, headers={"Prefer": "wait=1"})
    assert r.status == 202, r
    assert r.json()["state"] in ("prepared", "sending"), r
    again = gw.submit(token, "late-1", body, route=chat, headers={"Prefer": "wait=30"})
    assert again.status == 200 and again.body.endswith(b"data: [DONE]\n\n"), again
    assert len(creates(mock, "/v1/chat/completions")) == 1


def test_an_openai_responses_stream_is_recorded_replayed_and_assembled(gateway_factory, mock,
                                                                       token):
    """The Responses API's events (response.created … response.completed): whole only with
    response.completed; the same request whole gets the completed response the stream ended
    with; its usage settles the cost."""
    sfx = uuid.uuid4().hex[:6]
    e = responses_entry(mock, "resp" + sfx)
    gw = gateway_factory(providers=[e], env=ENV)
    route = e["name"] + "/responses"
    body = {"model": "gpt-4o-mini", "input": "Say hello", "stream": True, "max_output_tokens": 50,
            "_mock": {"events": 3}}
    r = gw.submit(token, "resp-1", body, route=route, headers={"Prefer": "wait=20"})
    assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream"), r
    text = r.body.decode()
    assert text.startswith("event: response.created\n") and "event: response.completed\n" in text
    again = gw.submit(token, "resp-1", body, route=route, headers={"Prefer": "wait=20"})
    assert again.body == r.body and again.headers.get("idempotent-replayed") == "true"
    whole = gw.submit(token, "resp-1", dict(body, stream=False), route=route,
                      headers={"Prefer": "wait=20"})
    w = whole.json()
    assert w["object"] == "response" and w["status"] == "completed", w
    assert w["output"][0]["content"][0]["text"] == "tok0 tok1 tok2 ", w
    j = gw.job(token, r.headers["x-idemgate-job-id"]).json()
    assert j["cost"]["estimate_micros"] == round(1000 * 0.15 + 50 * 0.6), j["cost"]
    want = j["usage"]["input_tokens"] * 0.15 + j["usage"]["output_tokens"] * 0.6
    assert abs(j["cost"]["micros"] - want) <= 1, (j["cost"], j["usage"])
    assert len(creates(mock, "/v1/responses")) == 1
    # Cut before response.completed, and not stored ("store": false): it cannot be read back,
    # so it stays in doubt, never resent.
    cut = gw.submit(token, "resp-cut", dict(body, store=False, _mock={"events": 4, "cut_after": 3}),
                    route=route, headers={"Prefer": "respond-async"})
    j = wait_state(gw, token, cut.json()["id"], ("unknown", "review", "completed", "failed"))
    assert j["state"] in ("unknown", "review"), j
    time.sleep(3)  # past a reconcile: its read of the generation finds nothing
    j = gw.job(token, cut.json()["id"]).json()
    assert j["state"] in ("unknown", "review"), j
    assert len(creates(mock, "/v1/responses")) == 2



def test_a_cut_responses_stream_is_read_back_by_its_id(gateway_factory, mock, token):
    """Issue 25 §3: where the provider lets us read by id, reconciliation completes the record.
    A Responses stream (stored: the provider's default) cut after response.created named its
    response; the job is in doubt, never resent, and the reconciler reads GET
    /v1/responses/{id}: in progress (read again later), then completed — a found task is the
    truth: the job is completed with the response, its usage settles the cost, and the same
    request streamed again gets the events that response stands for."""
    sfx = uuid.uuid4().hex[:6]
    e = responses_entry(mock, "rback" + sfx)
    gw = gateway_factory(providers=[e], env=ENV)
    route = e["name"] + "/responses"
    body = {"model": "gpt-4o-mini", "input": "read back " + sfx, "stream": True,
            "_mock": {"events": 4, "cut_after": 3, "reads_in_progress": 1}}
    before = len(creates(mock, "/v1/responses"))
    r = gw.submit(token, "rback-" + sfx, body, route=route, headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    job_id = r.json()["id"]
    j = wait_state(gw, token, job_id, ("completed", "failed", "review"), timeout=30)
    assert j["state"] == "completed", j
    assert j["remote_id"].startswith("resp_"), j
    assert len(creates(mock, "/v1/responses")) == before + 1  # read back, never resent
    assert j["usage"]["output_tokens"] == 4, j
    want = j["usage"]["input_tokens"] * 0.15 + j["usage"]["output_tokens"] * 0.6
    assert abs(j["cost"]["micros"] - want) <= 1, (j["cost"], j["usage"])
    whole = gw.submit(token, "rback-" + sfx, dict(body, stream=False), route=route,
                      headers={"Prefer": "wait=5"})
    w = whole.json()
    assert whole.status == 200 and w["status"] == "completed", w
    assert w["output"][0]["content"][0]["text"] == "tok0 tok1 tok2 tok3 ", w
    again = gw.submit(token, "rback-" + sfx, body, route=route, headers={"Prefer": "wait=5"})
    text = again.body.decode()
    assert again.status == 200 and again.headers.get("idempotent-replayed") == "true", again
    assert "tok0 tok1 tok2 tok3 " in text and "event: response.completed\n" in text, text


def test_a_background_response_is_followed_to_its_end(gateway_factory, mock, token):
    """Issue 25 §1: OpenAI Responses with "background": true answers at once with the response
    queued; the job is accepted with its id and followed by GET /v1/responses/{id} (in progress,
    then completed) as an async task is polled; the completed response is the job's result, its
    usage settles the cost, one create. The same key replays it; "store": false with background
    is the provider's 400 (failed, nothing generated)."""
    sfx = uuid.uuid4().hex[:6]
    e = responses_entry(
        mock, "bg" + sfx,
        reconcile={"strategy": "none", "window_seconds": 60,
                   "task": {"path": "/v1/responses/{id}"},
                   "found_status": {"path": "$.status", "interval_ms": 200,
                                    "map": {"queued": "queued", "in_progress": "running",
                                            "completed": "succeeded", "incomplete": "succeeded",
                                            "failed": "failed", "cancelled": "canceled"}}})
    gw = gateway_factory(providers=[e], env=ENV)
    route = e["name"] + "/responses"
    body = {"model": "gpt-4o-mini", "input": "background " + sfx, "background": True,
            "_mock": {"events": 5, "reads_in_progress": 2}}
    before = len(creates(mock, "/v1/responses"))
    r = gw.submit(token, "bg-" + sfx, body, route=route, headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    job_id = r.json()["id"]
    j = gw.job(token, job_id).json()
    assert j["state"] in ("prepared", "sending", "accepted", "completed"), j
    j = wait_state(gw, token, job_id, ("completed", "failed", "unknown", "review"), timeout=30)
    assert j["state"] == "completed", j
    assert j["remote_id"].startswith("resp_") and j["polls"] >= 3, j
    assert len(creates(mock, "/v1/responses")) == before + 1
    assert j["usage"]["output_tokens"] == 5, j
    want = j["usage"]["input_tokens"] * 0.15 + j["usage"]["output_tokens"] * 0.6
    assert abs(j["cost"]["micros"] - want) <= 1, (j["cost"], j["usage"])
    again = gw.submit(token, "bg-" + sfx, body, route=route, headers={"Prefer": "wait=5"})
    w = again.json()
    assert again.status == 200 and again.headers.get("idempotent-replayed") == "true", again
    assert w["status"] == "completed" and w["id"] == j["remote_id"], w
    assert w["output"][0]["content"][0]["text"] == "tok0 tok1 tok2 tok3 tok4 ", w
    # A client that waits gets the finished response in one call.
    waited = gw.submit(token, "bg2-" + sfx, dict(body, input="waited " + sfx), route=route,
                       headers={"Prefer": "wait=20"})
    assert waited.status == 200 and waited.json()["status"] == "completed", waited
    # A cancel while it is in progress: the provider's cancel is sent once, the job ends
    # canceled when the provider says cancelled.
    long = gw.submit(token, "bg4-" + sfx, dict(body, input="long " + sfx,
                                               _mock={"events": 5, "reads_in_progress": 100000}),
                     route=route, headers={"Prefer": "respond-async"})
    long_id = long.json()["id"]
    j = wait_state(gw, token, long_id, ("accepted",), timeout=20)
    assert j["state"] == "accepted" and j["provider_status"] in ("queued", "running"), j
    h = {"Authorization": f"Bearer {token}"}
    c = gw.http.request("POST", f"/v1/jobs/{long_id}/cancel", "", h)
    assert c.status == 202, c
    j = wait_state(gw, token, long_id, ("canceled", "completed", "failed", "review"), timeout=20)
    assert j["state"] == "canceled", j
    # A response that fails at the provider: failed, and never served as a 200.
    failing = gw.submit(token, "bg5-" + sfx, dict(body, input="fails " + sfx,
                                                  _mock={"events": 2, "fail": True}),
                        route=route, headers={"Prefer": "wait=20"})
    assert failing.status == 502, failing
    assert failing.headers["x-idemgate-state"] == "failed", failing
    # background needs store: the provider refuses it, nothing generated.
    bad = gw.submit(token, "bg3-" + sfx, dict(body, store=False), route=route,
                    headers={"Prefer": "wait=10"})
    j = gw.job(token, bad.headers["x-idemgate-job-id"]).json()
    assert j["state"] == "failed", j
    # One create for each of the four keys the provider accepted (the cancelled one included,
    # the provider's 400 not a create): nothing sent twice by polling, replays or the cancel.
    assert len(creates(mock, "/v1/responses")) == before + 4


def test_kill_9_mid_responses_stream_is_read_back_by_the_id_kept_while_it_ran(
        gateway_factory, mock, token):
    """A replica killed mid-stream loses the stream, not the generation: the id its first event
    named (response.created) is kept on the row while the call goes on, so when the lease runs
    out another replica's reconciler reads the response back by it — completed, one create."""
    sfx = uuid.uuid4().hex[:6]
    e = responses_entry(mock, "rkill" + sfx)
    gw = gateway_factory(providers=[e], env=ENV)
    route = e["name"] + "/responses"
    body = {"model": "gpt-4o-mini", "input": "killed " + sfx, "stream": True,
            "_mock": {"events": 8, "event_delay_ms": 400}}
    r = gw.submit(token, "rkill-" + sfx, body, route=route, headers={"Prefer": "respond-async"})
    job_id = r.json()["id"]
    deadline = time.monotonic() + 20
    while True:  # no client waits on it: the id is kept all the same
        j = gw.job(token, job_id).json()
        if j["remote_id"]:
            break
        assert time.monotonic() < deadline, j
        time.sleep(0.05)
    assert j["state"] == "sending" and j["remote_id"].startswith("resp_"), j
    gw.proc.kill()  # mid-stream
    gw.proc.wait()
    other = gateway_factory(providers=[e], env=ENV)
    j = wait_state(other, token, job_id, ("completed", "failed", "review"), timeout=40)
    assert j["state"] == "completed", j
    assert j["usage"]["output_tokens"] == 8, j
    assert len(creates(mock, "/v1/responses")) == 1


def test_a_resume_with_no_new_event_keeps_the_record_and_resumes_later(gateway_factory, mock,
                                                                        token, psql):
    """A background stream cut after 4 events whose first resume is cut again before any new
    event: the job stays in doubt with its record (`resume_failed`), and the next resume
    completes it — never read back whole, which would replace the events its client was given
    (the randomised campaign's seed 3303 at full size found this: the record became the
    response's JSON)."""
    sfx = uuid.uuid4().hex[:6]
    e = responses_entry(mock, "again" + sfx)
    gw = gateway_factory(providers=[e], env=ENV)
    route = e["name"] + "/responses"
    before = len(creates(mock, "/v1/responses"))
    body = {"model": "gpt-4o-mini", "input": "again " + sfx, "stream": True, "background": True,
            "_mock": {"events": 6, "cut_after": 4, "resume_cut_after": 0}}
    live = Live(gw, token, route, "again-" + sfx, body)
    job_id = live.resp.getheader("X-Idemgate-Job-Id")
    live.rest_or_cut()
    assert live.data.count(b"\n\n") == 4, live.data
    j = wait_state(gw, token, job_id, ("completed", "failed", "review"), timeout=40)
    assert j["state"] == "completed", j
    outcomes = [r[0] for r in psql(f"SELECT outcome FROM attempts WHERE operation_id = "
                                   f"'{job_id}' ORDER BY seq")]
    assert "resume_failed" in outcomes and outcomes[-1] == "resumed", outcomes
    again = gw.submit(token, "again-" + sfx, body, route=route, headers={"Prefer": "wait=5"})
    text = again.body
    assert text.startswith(live.data), (live.data, text)
    seqs = sequence_numbers(text)
    assert seqs == list(range(len(seqs))) and text.count(b"event: response.completed\n") == 1
    assert len(creates(mock, "/v1/responses")) == before + 1


@pytest.mark.parametrize("events", [200, 60], ids=["twice-the-bound", "under-twice"])
def test_a_background_stream_longer_than_the_record_may_be_is_read_back_whole(gateway_factory,
                                                                             mock, token, psql,
                                                                             events):
    """A background Responses stream longer than the profile's max_response_bytes: the record
    is cut at the bound, the job is in doubt, and the reconciler resumes the response — whose
    stream is as long, cut at the same bound. Before: each resume was taken for "no new event,
    later" (`resume_failed`), the whole stream downloaded again every interval until the window
    closed, and the job went to `review` without its result (a paid generation lost to an
    operator). Now a resume cut by the bound reads the response back whole (its JSON, shorter
    than its events): `completed`, one create. A stream under twice the bound: the record kept
    (up to the bound) joined with its resume passes the bound too — read back whole as well,
    never a result longer than the bound (a first version completed it with 11 458 bytes)."""
    sfx = uuid.uuid4().hex[:6]
    rec = dict(json.load(open(os.path.join(PROFILES, "openai-responses.json")))["reconcile"],
               window_seconds=60, interval_ms=300)
    e = responses_entry(mock, "bound" + sfx, max_response_bytes=8192, reconcile=rec)
    gw = gateway_factory(providers=[e], env=ENV)
    route = e["name"] + "/responses"
    before = len(creates(mock, "/v1/responses"))
    body = {"model": "gpt-4o-mini", "input": "bound " + sfx, "stream": True, "background": True,
            "_mock": {"events": events}}
    r = gw.submit(token, "bound-" + sfx, body, route=route, headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    job_id = r.json()["id"]
    j = wait_state(gw, token, job_id, ("completed", "failed", "review"), timeout=40)
    outcomes = [x[0] for x in psql(f"SELECT outcome FROM attempts WHERE operation_id = "
                                   f"'{job_id}' ORDER BY seq")]
    assert j["state"] == "completed", (j, outcomes)
    assert outcomes.count("resume_failed") <= 1, outcomes
    kept = psql(f"SELECT length(resp_body) FROM operations WHERE id = '{job_id}'")
    assert int(kept[0][0]) <= 8192, (kept, outcomes)
    assert len(creates(mock, "/v1/responses")) == before + 1


def test_a_stream_kept_on_its_row_as_it_arrives_stops_at_the_bound(gateway_factory, mock, token,
                                                                    psql):
    """A streamed create no client reads live here (`respond-async`) is kept on its row in
    batches as it arrives. Before: the batches went on past the profile's max_response_bytes —
    the whole 3 s stream written to the row, 8 times the bound. Now the row holds at most the
    bound; the stream over it is in doubt, as before, and sent once."""
    [chat, _], route, _ = entries(mock)
    chat["max_response_bytes"] = 4096
    chat["reconcile"] = {"strategy": "none", "window_seconds": 30}
    gw = gateway_factory(providers=[chat], env=ENV)
    sfx = uuid.uuid4().hex[:6]
    before = len(creates(mock, "/v1/chat/completions"))
    body = chat_body(events=200, event_delay_ms=15)
    body["messages"][0]["content"] = "bound " + sfx
    r = gw.submit(token, "bound-" + sfx, body, route=route, headers={"Prefer": "respond-async"})
    assert r.status == 202, r
    job_id = r.json()["id"]
    j = wait_state(gw, token, job_id, ("unknown", "review", "completed", "failed"), timeout=30)
    assert j["state"] in ("unknown", "review"), j
    kept = psql(f"SELECT coalesce(length(resp_body), 0) FROM operations WHERE id = '{job_id}'")
    assert 0 < int(kept[0][0]) <= 4096, kept
    assert len(creates(mock, "/v1/chat/completions")) == before + 1


def test_a_cut_background_stream_is_resumed_after_its_last_event(gateway_factory, mock, token,
                                                                  psql):
    """Issue 25 §1, §3: a Responses stream created with "background": true goes on generating
    when its connection is cut, and the provider resumes it (GET
    /v1/responses/{id}?stream=true&starting_after=<sequence_number>). The reconciler resumes it
    after the last whole event recorded and appends what follows: the job is completed with one
    event sequence whose start is byte for byte what the live client was given before the cut —
    a retry replays it, the Python client goes on from where it was instead of raising
    StreamDiverged — never a second create. A resume cut again keeps what it added, and the next
    one goes on from there."""
    import sys
    sys_path = os.path.join(ROOT, "clients", "python")
    if sys_path not in sys.path:
        sys.path.insert(0, sys_path)
    sfx = uuid.uuid4().hex[:6]
    e = responses_entry(mock, "resume" + sfx)
    gw = gateway_factory(providers=[e], env=ENV)
    route = e["name"] + "/responses"
    before = len(creates(mock, "/v1/responses"))
    # Cut after 4 events (created, in_progress, tok0, tok1); the first resume is cut again
    # before event 6 (after tok2, tok3); the second goes to the end.
    body = {"model": "gpt-4o-mini", "input": "resume " + sfx, "stream": True, "background": True,
            "_mock": {"events": 6, "cut_after": 4, "resume_cut_after": 6}}
    live = Live(gw, token, route, "resume-" + sfx, body)
    assert live.resp.status == 200, live.resp.status
    job_id = live.resp.getheader("X-Idemgate-Job-Id")
    cut = live.rest_or_cut()
    assert cut and live.data.count(b"\n\n") == 4, live.data
    j = wait_state(gw, token, job_id, ("completed", "failed", "review"), timeout=40)
    assert j["state"] == "completed", j
    assert len(creates(mock, "/v1/responses")) == before + 1  # resumed, never resent
    assert j["usage"]["output_tokens"] == 6, j
    want = j["usage"]["input_tokens"] * 0.15 + j["usage"]["output_tokens"] * 0.6
    assert abs(j["cost"]["micros"] - want) <= 1, (j["cost"], j["usage"])
    outcomes = [r[0] for r in psql(f"SELECT outcome FROM attempts WHERE operation_id = "
                                   f"'{job_id}' ORDER BY seq")]
    assert outcomes[-2:] == ["resumed_partial", "resumed"], outcomes
    again = gw.submit(token, "resume-" + sfx, body, route=route, headers={"Prefer": "wait=5"})
    assert again.status == 200 and again.headers.get("idempotent-replayed") == "true", again
    text = again.body
    assert text.startswith(live.data), (live.data, text)  # the same sequence, completed
    seqs = sequence_numbers(text)
    assert seqs == list(range(len(seqs))) and text.count(b"event: response.completed\n") == 1, text
    assert b"tok0 tok1 tok2 tok3 tok4 tok5 " in text, text
    # The Python client, cut after the first four events, asks again with the same key and
    # goes on from there: the record's start is what it was given.
    from idemgate import Client
    client = Client(f"http://127.0.0.1:{gw.port}", token)
    body2 = dict(body, input="resume client " + sfx, _mock={"events": 6, "cut_after": 4})
    events = list(client.stream(route, body2, "resume-client-" + sfx, wait=40))
    types = [ev.event for ev in events]
    assert types[0] == "response.created" and types[-1] == "response.completed", types
    assert len(types) == 10 and types.count("response.output_text.delta") == 6, types
    assert len(creates(mock, "/v1/responses")) == before + 2


@pytest.mark.parametrize("live", [False, True], ids=["async", "live-spooled"])
def test_kill_9_mid_background_stream_resumes_from_the_batches_kept(gateway_factory, mock,
                                                                     token, psql, tmp_path, live):
    """Issue 25 §2: a stream's record is kept on its row in batches as it arrives, not only with
    the result. A replica killed mid-stream leaves what it had kept: another replica's
    reconciler resumes the background response after the last whole event kept, and the record
    is the one event sequence, complete — one create. live-spooled: a client waits on it and the
    live stream, spooled to a file past 256 bytes, is where each batch is read from."""
    sfx = uuid.uuid4().hex[:6]
    e = responses_entry(mock, "rbatch" + sfx)
    spool = tmp_path / "spool"
    spool.mkdir()
    gw = gateway_factory(providers=[e], env=ENV, stream_memory_bytes=256,
                         stream_spool_dir=str(spool))
    route = e["name"] + "/responses"
    body = {"model": "gpt-4o-mini", "input": "batches " + sfx, "stream": True,
            "background": True, "_mock": {"events": 12, "event_delay_ms": 300}}
    before = len(creates(mock, "/v1/responses"))
    if live:
        client = Live(gw, token, route, "rbatch-" + sfx, body)
        job_id = client.resp.getheader("X-Idemgate-Job-Id")
    else:
        r = gw.submit(token, "rbatch-" + sfx, body, route=route,
                      headers={"Prefer": "respond-async"})
        job_id = r.json()["id"]
    first_batch_kept(psql, job_id)
    if live:
        assert spooled(gw) == 1
    gw.proc.kill()  # mid-stream: what was kept stays
    gw.proc.wait()
    if live:
        client.close()
    partial = bytes.fromhex(psql(f"SELECT encode(resp_body, 'hex') FROM operations "
                                 f"WHERE id = '{job_id}'")[0][0])
    assert partial.startswith(b"event: response.created\n"), partial
    other = gateway_factory(providers=[e], env=ENV)
    j = wait_state(other, token, job_id, ("completed", "failed", "review"), timeout=40)
    assert j["state"] == "completed", j
    assert j["usage"]["output_tokens"] == 12, j
    outcomes = [row[0] for row in psql(f"SELECT outcome FROM attempts WHERE operation_id = "
                                       f"'{job_id}' ORDER BY seq")]
    assert outcomes[-1] == "resumed", outcomes
    again = other.submit(token, "rbatch-" + sfx, body, route=route, headers={"Prefer": "wait=5"})
    text = again.body
    assert again.status == 200 and text.startswith(partial[:partial.rfind(b"\n\n") + 2]), text
    seqs = sequence_numbers(text)
    assert seqs == list(range(len(seqs))) and b"event: response.completed\n" in text, text
    assert len(creates(mock, "/v1/responses")) == before + 1


def test_a_kept_record_that_is_whole_is_concluded_not_resumed(gateway_factory, mock, token,
                                                              psql):
    """A replica killed after its background stream's last batch — the terminal event with it —
    was kept on the row, before its result's write: the record is the whole answer. It was
    resumed after that terminal event every interval (nothing comes after it), in doubt for the
    whole recovery window, then sent to review. It is concluded from the record now: completed,
    its usage and events as the live clients were given them, no call, one create."""
    sfx = uuid.uuid4().hex[:6]
    rec = dict(json.load(open(os.path.join(PROFILES, "openai-responses.json")))["reconcile"],
               window_seconds=60, interval_ms=300)
    e = responses_entry(mock, "rwhole" + sfx, reconcile=rec)
    gw = gateway_factory(providers=[e], env=ENV)
    route = e["name"] + "/responses"
    body = {"model": "gpt-4o-mini", "input": "whole " + sfx, "stream": True,
            "background": True, "_mock": {"events": 6, "event_delay_ms": 300}}
    before = len(creates(mock, "/v1/responses"))
    r = gw.submit(token, "rwhole-" + sfx, body, route=route, headers={"Prefer": "respond-async"})
    job_id = r.json()["id"]
    first_batch_kept(psql, job_id)
    gw.proc.kill()
    gw.proc.wait()
    [[remote]] = psql(f"SELECT remote_id FROM operations WHERE id = '{job_id}'")
    whole = mock.http.request("GET", f"/v1/responses/{remote}?stream=true").body
    assert whole.rstrip().endswith(b"}") and b"event: response.completed\n" in whole, whole
    # The last batch kept: the whole stream, as note_partial leaves it when the kill follows it.
    psql(f"UPDATE operations SET resp_body = decode('{whole.hex()}', 'hex') "
         f"WHERE id = '{job_id}'")
    other = gateway_factory(providers=[e], env=ENV)
    j = wait_state(other, token, job_id, ("completed", "failed", "review"), timeout=20)
    assert j["state"] == "completed", j
    assert j["usage"]["output_tokens"] == 6, j
    outcomes = [row[0] for row in psql(f"SELECT outcome FROM attempts WHERE operation_id = "
                                       f"'{job_id}' ORDER BY seq")]
    assert outcomes[-1] == "record_whole" and "resume_failed" not in outcomes, outcomes
    # Written by the verdict (the kept record had no answer's status): a 200 event stream.
    assert psql(f"SELECT resp_status, resp_headers->>'content-type' FROM operations "
                f"WHERE id = '{job_id}'") == [["200", "text/event-stream"]]
    again = other.submit(token, "rwhole-" + sfx, body, route=route, headers={"Prefer": "wait=5"})
    assert again.status == 200 and again.body == whole, again.body
    assert len(creates(mock, "/v1/responses")) == before + 1


def test_kill_9_before_any_batch_resumes_the_background_stream_from_its_start(
        gateway_factory, mock, token, psql):
    """A replica killed right after the stream named its response, before any batch of the
    record was kept (found by the campaign's `respond` kind): the row holds the id and no
    stream. The reconciler resumes it from the first event (GET ?stream=true, the profile's
    resume.start_query) rather than read the response back whole, so the record is the event
    sequence the live client was given the start of — not a JSON response."""
    sfx = uuid.uuid4().hex[:6]
    e = responses_entry(mock, "rstart" + sfx)
    gw = gateway_factory(providers=[e], env=ENV)
    route = e["name"] + "/responses"
    body = {"model": "gpt-4o-mini", "input": "from the start " + sfx, "stream": True,
            "background": True, "_mock": {"events": 6, "event_delay_ms": 150}}
    before = len(creates(mock, "/v1/responses"))
    live = Live(gw, token, route, "rstart-" + sfx, body)
    job_id = live.resp.getheader("X-Idemgate-Job-Id")
    live.until(b"event: response.in_progress")
    deadline = time.monotonic() + 10
    while True:  # the id is kept at once; the first batch only a second in
        row = psql(f"SELECT coalesce(remote_id, ''), resp_body IS NULL FROM operations "
                   f"WHERE id = '{job_id}'")[0]
        if row[0]:
            break
        assert time.monotonic() < deadline, row
        time.sleep(0.02)
    gw.proc.kill()
    gw.proc.wait()
    live.rest_or_cut()
    assert row[1] == "t", row  # nothing of the stream was kept
    other = gateway_factory(providers=[e], env=ENV)
    j = wait_state(other, token, job_id, ("completed", "failed", "review"), timeout=40)
    assert j["state"] == "completed", j
    outcomes = [r[0] for r in psql(f"SELECT outcome FROM attempts WHERE operation_id = "
                                   f"'{job_id}' ORDER BY seq")]
    assert outcomes[-1] == "resumed", outcomes
    again = other.submit(token, "rstart-" + sfx, body, route=route, headers={"Prefer": "wait=5"})
    text = again.body
    assert again.status == 200 and text.startswith(live.data), (live.data, text)
    seqs = sequence_numbers(text)
    assert seqs == list(range(len(seqs))) and b"event: response.completed\n" in text, text
    assert len(creates(mock, "/v1/responses")) == before + 1


def test_a_token_revoked_before_its_stream_began_gets_no_stream(gateway_factory, mock,
                                                                 database_url):
    """A streamed request waits, parked, until its job's stream shows its first output (a model
    that thinks first). Its token revoked meanwhile, the stream was still handed to it when the
    output came. A revoked token stops working within the tenants' bound (2 s), held requests
    included: 401."""
    import subprocess
    import threading
    from conftest import GATEWAY_BIN, tenant_token
    providers, chat, _ = entries(mock)
    gw = gateway_factory(providers=providers, env=ENV)
    name = "rev-stream-" + uuid.uuid4().hex[:8]
    tok = tenant_token(database_url, name)
    body = chat_body(events=3, output_delay_ms=4000)
    body["messages"][0]["content"] = "think first " + uuid.uuid4().hex
    before = len(mock.ledger())
    got = {}

    def held():
        live = Live(gw, tok, chat, "rev-stream-" + uuid.uuid4().hex, body, wait=30)
        got["status"] = live.resp.status
        got["body"] = live.rest()
        live.close()

    t = threading.Thread(target=held)
    t.start()
    deadline = time.monotonic() + 10
    while len(mock.ledger()) == before:  # parked: its create is at the provider
        assert time.monotonic() < deadline
        time.sleep(0.02)
    subprocess.check_call([GATEWAY_BIN, "tenant", "revoke", name],
                          env=dict(os.environ, DATABASE_URL=database_url))
    t.join(40)
    assert got["status"] == 401, (got["status"], got["body"][:300])
    assert b"Say hello" not in got["body"] and b"data:" not in got["body"]
