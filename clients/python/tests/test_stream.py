"""Client.stream's reading and resuming (idemgate.stream), against scripted answers: each event
is handed over once, in order, across a cut connection and the replay that follows; a stream
that exists whole nowhere is a StreamCut naming the job."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from idemgate import Client, JobEnded, KeyReused, StreamCut, StreamDiverged  # noqa: E402
from idemgate.stream import Event, _Cut, parse_events, stream_events  # noqa: E402

WHOLE = [b"data: {\"n\":1}\n", b"\n", b": keep-alive\n", b"event: x\n", b"data: a\n",
         b"data: b\n", b"\n", b"data: [DONE]\r\n", b"\r\n"]
EVENTS = [Event(None, '{"n":1}'), Event("x", "a\nb"), Event(None, "[DONE]")]


def test_parse_events():
    assert list(parse_events(WHOLE)) == EVENTS
    assert list(parse_events(WHOLE[:-1])) == EVENTS[:2]  # the last event never dispatched
    assert list(parse_events([b"data: [DO"])) == []        # cut inside a line


def cut_after(lines, n):
    """The lines, then the connection drops."""
    def gen():
        yield from lines[:n]
        raise _Cut("reset")
    return gen()


class Script:
    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = []

    def __call__(self, route, body, key, wait):
        self.calls.append((route, body, key, wait))
        status, headers, lines = self.answers.pop(0)
        return status, headers, lines, lambda: None


SSE = {"content-type": "text/event-stream", "x-idemgate-job-id": "job_1"}


def client():
    return Client("http://127.0.0.1:1", "t", sleep=lambda s: None)


def test_a_cut_connection_is_resumed_by_key_and_each_event_seen_once():
    script = Script((200, SSE, cut_after(WHOLE, 5)), (200, SSE, iter(WHOLE)))
    got = list(_run(script))
    assert got == EVENTS
    assert [c[2] for c in script.calls] == ["k1", "k1"]  # the same key both times
    assert script.calls[0][1] == script.calls[1][1] == b'{"model":"m","stream":true}'


def _run(script):
    c = client()
    return stream_events(c, "p/chat/completions", b'{"model":"m","stream":true}', "k1", 5,
                         open_stream=script)


def test_a_stream_whole_nowhere_is_a_stream_cut_naming_the_job():
    script = Script((200, SSE, cut_after(WHOLE, 2)),
                    (202, {"content-type": "application/json", "x-idemgate-job-id": "job_1"},
                     iter([b'{"id":"job_1","state":"unknown"}'])))
    got = []
    with pytest.raises(StreamCut) as e:
        for ev in _run(script):
            got.append(ev)
    assert got == EVENTS[:1] and e.value.job_id == "job_1"


@pytest.mark.parametrize("status,state", [(502, "failed"), (429, "failed"), (503, "failed"),
                                          (409, "canceled")])
def test_a_jobs_stored_end_is_final_and_names_the_job(status, state):
    """A key whose job ended without a stream is answered with its stored end: the gateway's
    502 job-failed or 409 job-canceled, or the provider's own status. It is the job's answer,
    never retried and never an outage. Before, a 502 or 503 read as Unavailable ("send it again
    later") and a 429 as RateLimited, the job's id lost."""
    script = Script((status, {"content-type": "application/json", "x-idemgate-job-id": "job_1",
                              "x-idemgate-state": state}, iter([b'{"error":"no"}'])))
    with pytest.raises(JobEnded) as e:
        list(_run(script))
    assert (e.value.job_id, e.value.state, e.value.status) == ("job_1", state, status)
    assert e.value.body == b'{"error":"no"}' and len(script.calls) == 1


def test_a_refusal_is_the_usual_error():
    script = Script((422, {"content-type": "application/problem+json"},
                     iter([b'{"type":"urn:idemgate:problem:idempotency-key-reused",'
                           b'"detail":"other body"}'])))
    with pytest.raises(KeyReused):
        list(_run(script))


def test_a_record_that_is_not_the_stream_given_is_never_skipped_into():
    """After a cut, the replay's first events are checked against those given: a record that
    differs (an error event before output, then a later attempt that generated; a stream read
    back whole) raises StreamDiverged — nothing is skipped on a guess —, and reading again from
    the start with the same key gives the record whole."""
    refused = [b"event: message_start\n", b"data: {\"id\":\"msg_1\"}\n", b"\n",
               b"event: error\n", b"data: {\"type\":\"overloaded_error\"}\n", b"\n"]
    other = [b"event: message_start\n", b"data: {\"id\":\"msg_2\"}\n", b"\n"] + WHOLE
    script = Script((200, SSE, cut_after(refused, 6)), (200, SSE, iter(other)))
    got = []
    with pytest.raises(StreamDiverged) as e:
        for ev in _run(script):
            got.append(ev)
    assert [ev.event for ev in got] == ["message_start", "error"]
    assert e.value.job_id == "job_1"
    again = Script((200, SSE, iter(other)))
    assert list(_run(again))[0] == Event("message_start", '{"id":"msg_2"}')


def _served(raw):
    """An HTTP response read from a socket that sends raw and closes."""
    import http.client
    import socket
    import threading
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve():
        c, _ = srv.accept()
        c.recv(65536)
        c.sendall(raw)
        c.close()
        srv.close()
    threading.Thread(target=serve, daemon=True).start()
    conn = http.client.HTTPConnection("127.0.0.1", srv.getsockname()[1], timeout=5)
    conn.request("GET", "/")
    return conn.getresponse()


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"


@pytest.mark.parametrize("raw, cut", [
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n8\r\ndata:1\n\n\r\n8\r\ndata:2\n\n\r\n0\r\n\r\n",
     False),
    # The last chunk never came: readline() would have returned b"" as at the end.
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n8\r\ndata:1\n\n\r\n8\r\ndata:2\n\n\r\n", True),
    (HEAD + b"Content-Length: 16\r\n\r\ndata:1\n\ndata:2\n\n", False),
    (HEAD + b"Content-Length: 30\r\n\r\ndata:1\n\ndata:2\n\n", True),
])
def test_a_body_cut_before_its_end_is_a_cut_not_a_whole_stream(raw, cut):
    from idemgate.stream import _lines
    got = []
    try:
        for line in _lines(_served(raw)):
            got.append(line)
        ended = True
    except _Cut:
        ended = False
    assert got == [b"data:1\n", b"\n", b"data:2\n", b"\n"], got
    assert ended is not cut


JOB = {"content-type": "application/json", "x-idemgate-job-id": "job_1"}


@pytest.mark.parametrize("status,headers,data,had_job,want", [
    # A job document: read by its state.
    (202, JOB, b'{"id":"job_1","state":"sending"}', False, ("pending", "sending")),
    (202, JOB, b'{"id":"job_1","state":"prepared"}', False, ("pending", "prepared")),
    (202, JOB, b'{"id":"job_1","state":"accepted"}', False, ("pending", "accepted")),
    (202, JOB, b'{"id":"job_1","state":"unknown"}', False, ("cut", "unknown")),
    (202, JOB, b'{"id":"job_1","state":"review"}', False, ("cut", "review")),
    (200, {"content-type": "application/json"}, b'{"id":"job_1","state":"completed",'
     b'"terminal":true}', False, ("ended", "completed")),
    # A job without a document to read: in doubt, as before.
    (202, JOB, b"not json", False, ("cut", None)),
    (200, {"content-type": "application/json"}, b"{}", True, ("cut", None)),
    # A terminal job's stored answer, whatever its status.
    (503, dict(JOB, **{"x-idemgate-state": "failed"}), b"{}", False, ("ended", "failed")),
    # The gateway's own refusals: passing, or the request's.
    (503, {"content-type": "application/problem+json"}, b"{}", False, ("retry", None)),
    (429, {"content-type": "application/problem+json"}, b"{}", True, ("retry", None)),
    (422, {"content-type": "application/problem+json"}, b"{}", False, ("fail", None)),
])
def test_answer_kind(status, headers, data, had_job, want):
    from idemgate.stream import answer_kind
    assert answer_kind(status, headers, data, had_job) == want


def test_a_wait_that_ran_out_before_the_first_output_opens_again_with_the_same_key():
    """202 with a job still on its way (a model thinking past the wait, a provider's 429 backed
    off): not a cut. Before, StreamCut ("paid and in doubt") — a caller asking again under a
    new key paid twice."""
    script = Script((202, JOB, iter([b'{"id":"job_1","state":"sending"}'])),
                    (200, SSE, iter(WHOLE)))
    assert list(_run(script)) == EVENTS
    assert [c[2] for c in script.calls] == ["k1", "k1"]


def test_a_job_still_on_its_way_after_every_wait_is_unknown_naming_the_job():
    from idemgate import Unknown
    c = client()
    waits = [(202, JOB, iter([b'{"id":"job_1","state":"accepted"}']))
             for _ in range(c.retry.max_attempts + 1)]
    script = Script(*waits)
    with pytest.raises(Unknown) as e:
        list(stream_events(c, "p/chat/completions", b"{}", "k1", 5, open_stream=script))
    assert (e.value.job_id, e.value.state) == ("job_1", "accepted")
    assert len(script.calls) == c.retry.max_attempts


def _cut_each_time():
    return (200, SSE, cut_after(WHOLE, 2))


def _waited_out_each_time():
    return (202, JOB, iter([b'{"id":"job_1","state":"sending"}']))


def _refused_each_time():
    return (503, {"content-type": "application/problem+json"},
            iter([b'{"type":"urn:idemgate:problem:store-unavailable"}']))


def _unreachable_each_time():
    raise ConnectionResetError("reset by peer")


@pytest.mark.parametrize("answer,raised", [
    (_cut_each_time, "Unavailable"),
    (_waited_out_each_time, "Unknown"),
    (_refused_each_time, "Unavailable"),
    (_unreachable_each_time, "ConnectionResetError"),
])
def test_a_stream_is_opened_max_attempts_times_in_all(answer, raised):
    """max_attempts is the attempts in all, the first included — RetryPolicy's meaning and
    the Node client's streamEvents'. Before, a cut, a wait that ran out or a transport error
    opened the stream max_attempts + 1 times (a passing refusal, max_attempts)."""
    from idemgate import RetryPolicy
    c = Client("http://127.0.0.1:1", "t", sleep=lambda s: None, rnd=lambda: 0.0,
               retry=RetryPolicy(max_attempts=3))
    calls = []

    def opener(route, body, key, wait):
        calls.append(key)
        status, headers, lines = answer()
        return status, headers, lines, lambda: None
    with pytest.raises(Exception) as e:
        list(stream_events(c, "p/chat/completions", b"{}", "k1", 5, open_stream=opener))
    assert type(e.value).__name__ == raised, repr(e.value)
    assert calls == ["k1"] * 3, calls


def test_a_passing_refusal_is_retried_with_the_same_key_after_its_retry_after():
    """503 store-unavailable (which may follow a commit whose answer was lost) and 429 are
    answered again with the same key, after Retry-After. Before, raised at once."""
    slept = []
    c = Client("http://127.0.0.1:1", "t", sleep=slept.append, rnd=lambda: 0.0)
    script = Script((503, {"content-type": "application/problem+json", "retry-after": "2"},
                     iter([b'{"type":"urn:idemgate:problem:store-unavailable"}'])),
                    (429, {"content-type": "application/problem+json", "retry-after": "1"},
                     iter([b'{"type":"urn:idemgate:problem:rate-limited"}'])),
                    (200, SSE, iter(WHOLE)))
    got = list(stream_events(c, "p/chat/completions", b"{}", "k1", 5, open_stream=script))
    assert got == EVENTS and [x[2] for x in script.calls] == ["k1"] * 3
    assert slept == [2.0, 1.0], slept


def test_a_refusal_that_lasts_is_raised_after_the_retries():
    from idemgate import RateLimited
    c = Client("http://127.0.0.1:1", "t", sleep=lambda s: None, rnd=lambda: 0.0)
    answers = [(429, {"content-type": "application/problem+json"},
                iter([b'{"type":"urn:idemgate:problem:rate-limited"}']))
               for _ in range(c.retry.max_attempts)]
    script = Script(*answers)
    with pytest.raises(RateLimited) as e:
        list(stream_events(c, "p/chat/completions", b"{}", "k1", 5, open_stream=script))
    assert "same key" in str(e.value) and len(script.calls) == c.retry.max_attempts
