"""The batch runner's bookkeeping on a scripted client (no gateway, no network): spend, the
run stopped by a held-back job, a row left for the next run and resumed with the same key,
outputs recorded. The runner against the real gateway (kill -9, one create per row) is in
tests/integration/test_python_client.py."""

import hashlib
import io
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from idemgate import (IntegrityError, Job, KeyReused, Output, OutputsUnavailable,  # noqa: E402
                      Unavailable, Unknown, batch)


class FakeClient:
    """Plays the gateway: script(row_prompt) -> what submit does for that row."""

    def __init__(self, script):
        self.script, self.submits, self.jobs, self.bodies = script, [], {}, []

    def submit(self, route, body, key, wait=None):
        self.submits.append(key)
        self.bodies.append(json.loads(body))
        prompt = json.loads(body)["prompt"]
        act = self.script.get(prompt, "complete")
        if isinstance(act, Exception):
            raise act
        jid = "job_" + key[:12]
        data = {"id": jid, "state": "completed", "terminal": True, "idempotency_key": key,
                "cost": {"currency": "USD", "estimate_micros": 50000, "micros": 40000}}
        if act == "blocked":
            data = {"id": jid, "state": "prepared", "terminal": False, "idempotency_key": key,
                    "blocked": {"reason": "the provider's credential is tripped"}}
        if act == "archived":
            data["archive"] = [{"index": 0, "state": "archived", "sha256": "ab" * 32}]
        if act == "running":  # the provider has it: paid for, not finished when the run ends
            data = {"id": jid, "state": "sending", "terminal": False, "idempotency_key": key}
        if act == "canceled":  # someone cancelled it; the provider ended the task (and bills it)
            data.update(state="canceled", remote_id="task_" + key[:6], cancel_requested_at="t",
                        last_error="canceled at the provider on our request: stopped")
        self.jobs[jid] = data
        return Job(dict(data), replayed=key in self.submits[:-1])

    def get(self, jid):
        return Job(dict(self.jobs[jid]))

    def wait(self, job, timeout):
        j = job if isinstance(job, Job) else self.get(job)
        if not j.terminal:
            raise Unknown("not yet", job_id=j.id, state=j.state, job=j)
        return j

    def outputs(self, job, dest, timeout=None):
        self.outputs_timeouts = getattr(self, "outputs_timeouts", []) + [timeout]
        pending = self.pending_outputs.pop(0) if getattr(self, "pending_outputs", None) else None
        if pending == "mismatch":
            raise IntegrityError(f"output 0: SHA-256 {'00' * 32} differs from ETag {'ab' * 32}; "
                                 "the download was discarded")
        if pending is not None:
            raise OutputsUnavailable(f"job {job.id}: {pending}", job_id=job.id,
                                     pending=pending == "pending")
        return [Output(0, os.path.join(dest, f"{job.id}-0.png"), "ab" * 32, 3, "image/png")]


def make(tmp_path, prompts, script):
    m = tmp_path / "m.jsonl"
    m.write_text("".join(json.dumps({"route": "p/r", "identity": {"p": p}, "body": {"prompt": p}})
                         + "\n" for p in prompts))
    rows = batch.read_manifest(str(m))
    state = batch.State(str(tmp_path / "s.sqlite"))
    return rows, state, FakeClient(script)


def runner(client, state, rows, tmp_path, **kw):
    kw.setdefault("concurrency", 1)
    return batch.Runner(client, state, rows, str(tmp_path / "out"), row_timeout=0.1,
                        err=io.StringIO(), progress_every=0.01, **kw)


def test_spend_is_summed_shown_and_written(tmp_path):
    rows, state, c = make(tmp_path, ["a", "b", "c"], {})
    r = runner(c, state, rows, tmp_path, concurrency=2)
    r.run()
    assert r.spend() == {"USD": 120000}
    assert "spend 0.12 USD" in r.progress_line(0, 3)
    out = r.results(str(tmp_path / "res.jsonl"))
    assert batch.exit_code(out, r.stop.is_set()) == batch.EXIT_OK
    lines = [json.loads(x) for x in open(tmp_path / "res.jsonl")]
    assert [x["spend"] for x in lines] == [{"micros": 40000, "currency": "USD"}] * 3
    table = batch.summary_table(out, None, 1.0, r.spend(), "res.jsonl")
    assert "spend" in table and "0.12 USD" in table


def test_spend_is_omitted_when_jobs_report_none(tmp_path):
    rows, state, c = make(tmp_path, ["a"], {})
    orig = c.submit

    def no_cost(*a, **k):
        j = orig(*a, **k)
        j.data.pop("cost")
        c.jobs[j.id].pop("cost")
        return j
    c.submit = no_cost
    r = runner(c, state, rows, tmp_path)
    r.run()
    assert r.spend() == {} and "spend" not in r.progress_line(0, 1)
    r.results(str(tmp_path / "res.jsonl"))
    assert "spend" not in json.loads(open(tmp_path / "res.jsonl").readline())


def test_a_held_back_job_stops_the_run(tmp_path):
    rows, state, c = make(tmp_path, ["a", "b", "c", "d"], {"b": "blocked"})
    r = runner(c, state, rows, tmp_path)
    r.run()
    assert r.stop.is_set() and "credential" in r.stop_reason
    out = r.results(str(tmp_path / "res.jsonl"))
    assert [x["state"] for x in out] == ["completed", "submitted", "pending", "pending"]
    assert len(c.submits) == 2
    assert batch.exit_code(out, True) == batch.EXIT_STOPPED


def test_a_row_given_up_for_now_is_resumed_with_the_same_key(tmp_path):
    rows, state, c = make(tmp_path, ["a", "b"], {"b": Unavailable("503 every time", key="k")})
    r = runner(c, state, rows, tmp_path)
    r.run()
    out = r.results(str(tmp_path / "res.jsonl"))
    assert [x["state"] for x in out] == ["completed", "submitting"]
    assert batch.exit_code(out, False) == batch.EXIT_UNFINISHED
    # Next run: the gateway is back.
    c.script = {}
    r2 = runner(c, batch.State(str(tmp_path / "s.sqlite")), rows, tmp_path)
    r2.run()
    out = r2.results(str(tmp_path / "res.jsonl"))
    assert [x["state"] for x in out] == ["completed", "completed"]
    assert [x["submits"] for x in out] == [1, 2]
    assert c.submits == [rows[0].key, rows[1].key, rows[1].key], "row a not sent again"


def test_a_canceled_job_is_final_with_its_spend_not_failed_nor_resent(tmp_path):
    rows, state, c = make(tmp_path, ["a", "b"], {"b": "canceled"})
    r = runner(c, state, rows, tmp_path)
    r.run()
    assert not r.stop.is_set()
    assert "canceled 1" in r.progress_line(0, 2) and "failed" not in r.progress_line(0, 2)
    out = r.results(str(tmp_path / "res.jsonl"))
    assert [x["state"] for x in out] == ["completed", "canceled"]
    lines = [json.loads(x) for x in open(tmp_path / "res.jsonl")]
    b = lines[1]
    assert b["job_state"] == "canceled" and "error" not in b and "outputs" not in b, b
    assert b["spend"] == {"micros": 40000, "currency": "USD"}, "a cancelled task may be billed"
    assert "task_" in b["note"] and "on our request" in b["note"], b
    assert r.spend() == {"USD": 80000}
    assert batch.exit_code(out, False) == batch.EXIT_FAILED
    table = batch.summary_table(out, None, 1.0, r.spend(), "res.jsonl")
    assert [l.split() for l in table.splitlines()[1:3]] == [["completed", "1"], ["canceled", "1"]]
    # The next run leaves it alone: final, never submitted again.
    r2 = runner(c, batch.State(str(tmp_path / "s.sqlite")), rows, tmp_path)
    r2.run()
    assert c.submits == [rows[0].key, rows[1].key]
    assert [x["state"] for x in r2.results(str(tmp_path / "res.jsonl"))] == ["completed",
                                                                          "canceled"]


def test_archived_outputs_are_recorded(tmp_path):
    rows, state, c = make(tmp_path, ["a"], {"a": "archived"})
    r = runner(c, state, rows, tmp_path)
    r.run()
    r.results(str(tmp_path / "res.jsonl"))
    [line] = [json.loads(x) for x in open(tmp_path / "res.jsonl")]
    assert line["outputs"][0]["sha256"] == "ab" * 32 and "note" not in line
    assert line["outputs"][0]["path"].endswith(".png")


def test_outputs_still_pending_are_waited_for_then_recorded(tmp_path):
    """Client.outputs raising OutputsUnavailable(pending) is asked again (the archive is
    still copying); one that will never be archived is the row's note, not a wait."""
    rows, state, c = make(tmp_path, ["a", "b"], {"a": "archived", "b": "archived"})
    c.pending_outputs = ["pending", "pending", None, "output 0 is failed"]
    r = runner(c, state, rows, tmp_path, archive_timeout=60)
    r.run()
    r.results(str(tmp_path / "res.jsonl"))
    a, b = [json.loads(x) for x in open(tmp_path / "res.jsonl")]
    assert a["outputs"][0]["sha256"] == "ab" * 32 and "note" not in a, a
    assert "outputs" not in b and "output 0 is failed" in b["note"], b
    assert len(c.outputs_timeouts) == 4 and all(0 < t <= 5 for t in c.outputs_timeouts)


def _pending_until_the_wait_runs_out(c, r):
    c.pending_outputs = ["pending"]
    r.archive_timeout = 0


def _pending_until_the_run_is_stopped(c, r):
    c.pending_outputs = ["pending"]
    r.archive_timeout = 60
    orig = c.outputs

    def stop_then_pending(*a, **k):
        r.stop.set()
        return orig(*a, **k)
    c.outputs = stop_then_pending


@pytest.mark.parametrize("pending", [_pending_until_the_wait_runs_out,
                                     _pending_until_the_run_is_stopped])
def test_a_completed_job_whose_outputs_are_not_archived_yet_is_collected_by_the_next_run(
        tmp_path, pending):
    """The job is paid for but its outputs are not in hand: the row is not final, the exit
    status says run again, and the next run reads the same job and downloads them (before, the
    row was `completed` with a note saying run again, and a run again skipped it: exit 0)."""
    rows, state, c = make(tmp_path, ["a"], {"a": "archived"})
    r = runner(c, state, rows, tmp_path)
    pending(c, r)
    r.run()
    [out] = r.results(str(tmp_path / "res.jsonl"))
    assert out["state"] == "submitted" and out["job_state"] == "completed", out
    assert out["note"] == batch.OUTPUTS_PENDING and out["outputs"] is None, out
    assert out["spend_micros"] == 40000, "the spend is recorded at once"
    assert batch.exit_code([out], False) == batch.EXIT_UNFINISHED
    vars(c).pop("outputs", None)  # the archive has caught up (and nothing stops the run)
    r2 = runner(c, batch.State(str(tmp_path / "s.sqlite")), rows, tmp_path)
    r2.run()
    [out] = r2.results(str(tmp_path / "res.jsonl"))
    assert out["state"] == "completed" and out["note"] is None, out
    assert json.loads(out["outputs"])[0]["sha256"] == "ab" * 32
    assert c.submits == [rows[0].key], "never a new submit: the row's job is read again"
    assert batch.exit_code([out], False) == batch.EXIT_OK


def test_a_row_an_earlier_version_left_completed_without_its_outputs_is_collected(tmp_path):
    """Earlier versions recorded the same case as `completed` with the pending note: a run
    finds such a row and goes back to its job."""
    rows, state, c = make(tmp_path, ["a"], {"a": "archived"})
    c.pending_outputs = ["pending"]
    runner(c, state, rows, tmp_path, archive_timeout=0).run()
    state.update(rows[0].key, state="completed")  # as the earlier version wrote it
    r2 = runner(c, batch.State(str(tmp_path / "s.sqlite")), rows, tmp_path)
    r2.run()
    assert "1 with a job" in r2.err.getvalue(), r2.err.getvalue()
    [out] = r2.results(str(tmp_path / "res.jsonl"))
    assert out["state"] == "completed" and out["outputs"] and out["note"] is None, out
    assert c.submits == [rows[0].key]


def test_outputs_that_do_not_match_their_sha256_are_downloaded_again_by_the_next_run(tmp_path):
    """An IntegrityError (downloaded bytes whose SHA-256 differs: discarded) leaves the row
    not final, its error recorded, and the exit status says run again; the next run reads the
    same job and downloads again. Before, the row was `completed`, final: no run downloaded its
    outputs again, and the exit status said every row completed."""
    rows, state, c = make(tmp_path, ["a"], {"a": "archived"})
    c.pending_outputs = ["mismatch"]
    r = runner(c, state, rows, tmp_path, archive_timeout=60)
    r.run()
    [out] = r.results(str(tmp_path / "res.jsonl"))
    assert out["state"] == "submitted" and out["job_state"] == "completed", out
    assert out["note"] == batch.OUTPUTS_MISMATCH and out["outputs"] is None, out
    assert "SHA-256" in out["error"] and "discarded" in out["error"], out
    assert len(c.outputs_timeouts) == 1, "a mismatch is not waited on"
    assert batch.exit_code([out], False) == batch.EXIT_UNFINISHED
    [line] = [json.loads(x) for x in open(tmp_path / "res.jsonl")]
    assert line["state"] == "submitted" and "SHA-256" in line["error"], line
    r2 = runner(c, batch.State(str(tmp_path / "s.sqlite")), rows, tmp_path)
    r2.run()
    [out] = r2.results(str(tmp_path / "res.jsonl"))
    assert out["state"] == "completed" and out["note"] is None and out["error"] is None, out
    assert json.loads(out["outputs"])[0]["sha256"] == "ab" * 32
    assert c.submits == [rows[0].key], "never a new submit: the row's job is read again"
    assert batch.exit_code([out], False) == batch.EXIT_OK


def test_a_row_an_earlier_version_left_completed_with_discarded_outputs_is_collected(tmp_path):
    """Earlier versions recorded a mismatch as `completed` with `outputs: <the error>` as its
    note: a run finds such a row and downloads its outputs again."""
    rows, state, c = make(tmp_path, ["a"], {"a": "archived"})
    c.pending_outputs = ["mismatch"]
    runner(c, state, rows, tmp_path).run()
    old = state.all()[0]
    assert old["error"].startswith("outputs: output 0: SHA-256"), old
    # As the earlier version wrote it: f"outputs: {e}" as the note of a final row.
    state.update(rows[0].key, state="completed", note=old["error"], error=None)
    r2 = runner(c, batch.State(str(tmp_path / "s.sqlite")), rows, tmp_path)
    r2.run()
    assert "1 with a job" in r2.err.getvalue(), r2.err.getvalue()
    [out] = r2.results(str(tmp_path / "res.jsonl"))
    assert out["state"] == "completed" and out["outputs"] and out["note"] is None, out
    assert out["error"] is None, out
    assert c.submits == [rows[0].key]


def test_without_an_archive_the_provider_urls_are_named_not_downloaded(tmp_path):
    rows, state, c = make(tmp_path, ["a"], {})
    orig = c.submit

    def with_urls(*a, **k):
        j = orig(*a, **k)
        c.jobs[j.id]["result"] = {"status": 200, "body": {"data": [{"url": "http://x/1.png"}]}}
        return c.get(j.id)
    c.submit = with_urls
    r = runner(c, state, rows, tmp_path)
    r.run()
    r.results(str(tmp_path / "res.jsonl"))
    [line] = [json.loads(x) for x in open(tmp_path / "res.jsonl")]
    assert line["outputs"] == [{"index": 0, "url": "http://x/1.png"}]
    assert "no archive" in line["note"]


# --- a row's body compared with an earlier run's ----------------------------------------------

def write_manifest(path, bodies):
    """bodies: {prompt: body}, one JSONL row each, identified by its prompt."""
    path.write_text("".join(json.dumps({"route": "p/r", "identity": {"p": p}, "body": b}) + "\n"
                            for p, b in bodies.items()))
    return batch.read_manifest(str(path))


@pytest.mark.parametrize("a,b,same", [
    ({"prompt": "x", "n": 1}, {"n": 1, "prompt": "x"}, True),
    ({"prompt": "x", "opt": {"a": 1, "b": [1, {"c": 2, "d": 3}]}},
     {"opt": {"b": [1, {"d": 3, "c": 2}], "a": 1}, "prompt": "x"}, True),
    ({"prompt": "x", "n": 1}, {"prompt": "x", "n": 2}, False),
    ({"prompt": "x", "b": [1, 2]}, {"prompt": "x", "b": [2, 1]}, False),  # arrays keep order
])
def test_a_bodys_hash_ignores_member_order_as_the_gateway_does(a, b, same):
    ra, rb = batch.Row(1, "p/r", a, "k"), batch.Row(1, "p/r", b, "k")
    assert (ra.body_sha256 == rb.body_sha256) is same


def test_reordered_csv_columns_are_the_same_rows(tmp_path):
    (tmp_path / "1.csv").write_text("route,identity.p,body.prompt,body.n:int\np/r,x,hi,1\n")
    (tmp_path / "2.csv").write_text("body.n:int,identity.p,route,body.prompt\n1,x,p/r,hi\n")
    [r1], [r2] = (batch.read_manifest(str(tmp_path / n)) for n in ("1.csv", "2.csv"))
    assert (r1.key, r1.body_sha256) == (r2.key, r2.body_sha256)


def test_a_manifest_regenerated_with_reordered_members_resumes_every_row(tmp_path):
    """A finished row, a row whose job is still running and a row in doubt, resumed from a
    manifest whose bodies list their members in another order: the same requests, so nothing
    turns into an error (before: all three were `error`, the running job never collected)."""
    m = tmp_path / "m.jsonl"
    rows = write_manifest(m, {p: {"prompt": p, "n": 1} for p in "abc"})
    c = FakeClient({"b": "running", "c": Unavailable("503", key="k")})
    r = runner(c, batch.State(str(tmp_path / "s.sqlite")), rows, tmp_path)
    r.run()
    assert [x["state"] for x in r.results(str(tmp_path / "res.jsonl"))] == \
        ["completed", "submitted", "submitting"]
    c.jobs["job_" + rows[1].key[:12]].update(state="completed", terminal=True)
    c.script = {}
    rows = write_manifest(m, {p: {"n": 1, "prompt": p} for p in "abc"})
    r2 = runner(c, batch.State(str(tmp_path / "s.sqlite")), rows, tmp_path)
    r2.run()
    out = r2.results(str(tmp_path / "res.jsonl"))
    assert [x["state"] for x in out] == ["completed"] * 3, out
    assert c.submits == [rows[0].key, rows[1].key, rows[2].key, rows[2].key]
    assert "warning" not in r2.err.getvalue()
    assert batch.exit_code(out, False) == batch.EXIT_OK


def test_a_state_file_of_an_earlier_version_keeps_its_rows(tmp_path):
    """Earlier versions stored the hash of the body in the manifest's member order: that hash
    is the same body, and it is rewritten in the canonical form, so that a later reordered
    manifest is the same rows too."""
    m = tmp_path / "m.jsonl"
    rows = write_manifest(m, {"a": {"prompt": "a", "n": 1}})
    c = FakeClient({})
    runner(c, batch.State(str(tmp_path / "s.sqlite")), rows, tmp_path).run()
    unsorted = hashlib.sha256(b'{"prompt":"a","n":1}').hexdigest()
    assert unsorted != rows[0].body_sha256
    batch.State(str(tmp_path / "s.sqlite")).update(rows[0].key, body_sha256=unsorted)
    r2 = runner(c, batch.State(str(tmp_path / "s.sqlite")), rows, tmp_path)
    r2.run()
    [out] = r2.results(str(tmp_path / "res.jsonl"))
    assert out["state"] == "completed" and out["body_sha256"] == rows[0].body_sha256, out
    rows = write_manifest(m, {"a": {"n": 1, "prompt": "a"}})
    r3 = runner(c, batch.State(str(tmp_path / "s.sqlite")), rows, tmp_path)
    r3.run()
    assert [x["state"] for x in r3.results(str(tmp_path / "res.jsonl"))] == ["completed"]
    assert c.submits == [rows[0].key] and "warning" not in r3.err.getvalue()


@pytest.mark.parametrize("before,submits,warned", [
    # (how the first run left the row, its submits in all, whether the body change is warned)
    ("pending", 1, False),      # never sent: sent with the new body
    ("submitting", 2, False),   # in doubt: sent again, with the new body (the gateway decides)
    ("submitted", 1, True),     # a job running: waited for and collected, never sent again
    ("completed", 1, True),     # finished: left alone, not turned into an error
])
def test_a_body_that_really_changed_never_leaves_a_paid_job_behind(tmp_path, before, submits,
                                                                  warned):
    m = tmp_path / "m.jsonl"
    rows = write_manifest(m, {"a": {"prompt": "a", "n": 1}})
    state = batch.State(str(tmp_path / "s.sqlite"))
    c = FakeClient({"a": {"submitting": Unavailable("503", key="k"),
                          "submitted": "running"}.get(before, "complete")})
    if before == "pending":
        state.load(rows)
    else:
        runner(c, state, rows, tmp_path).run()
    assert [x["state"] for x in state.all()] == [before]
    job_id = state.all()[0]["job_id"]
    if job_id:
        c.jobs[job_id].update(state="completed", terminal=True)
    c.script = {}
    rows = write_manifest(m, {"a": {"prompt": "a", "n": 2}})
    r2 = runner(c, batch.State(str(tmp_path / "s.sqlite")), rows, tmp_path)
    r2.run()
    [out] = r2.results(str(tmp_path / "res.jsonl"))
    [line] = [json.loads(x) for x in open(tmp_path / "res.jsonl")]
    assert out["state"] == "completed" and not out["error"], out
    assert len(c.submits) == submits and c.bodies[-1]["n"] == (1 if warned else 2), c.bodies
    if job_id:
        assert out["job_id"] == job_id, "collected under the job its key holds"
    assert ("changed since an earlier run" in r2.err.getvalue()) is warned, r2.err.getvalue()
    assert ("warning" in line) is warned, line
    assert (out["body_sha256"] == rows[0].body_sha256) is not warned, \
        "the new body's hash once it is the one sent; the job's body's while it warns"
    assert batch.exit_code([out], False) == batch.EXIT_OK


class KeyHoldingClient(FakeClient):
    """Also plays the gateway's key check: a key holds the job of the first body sent under it;
    another body under it is answered 422 idempotency-key-reused, its detail naming that job
    (src/reply.c's text). lose: prompts whose first answer is lost after the job was made."""

    def __init__(self, script, lose=()):
        super().__init__(script)
        self.held, self.lose = {}, set(lose)

    def submit(self, route, body, key, wait=None):
        canon = json.dumps(json.loads(body), sort_keys=True)
        if key in self.held and self.held[key] != canon:
            self.submits.append(key)
            self.bodies.append(json.loads(body))
            jid = "job_" + key[:12]
            problem = {"type": "urn:idemgate:problem:idempotency-key-reused",
                       "title": "Idempotency-Key reused with different parameters",
                       "status": 422,
                       "detail": f"this key already belongs to job {jid}, whose request had "
                                 "another body; use a new key for a new intended output"}
            raise KeyReused(f"422 idempotency-key-reused: {problem['detail']}", status=422,
                            problem=problem, key=key)
        job = super().submit(route, body, key, wait)
        self.held.setdefault(key, canon)
        prompt = json.loads(body)["prompt"]
        if prompt in self.lose:
            self.lose.discard(prompt)
            raise Unavailable("the connection broke before the answer", key=key)
        return job


def test_a_row_in_doubt_sent_again_with_a_changed_body_collects_the_job_its_key_holds(tmp_path):
    """The first run's request made the job but its answer was lost (the row in doubt); the
    manifest's body then changed under the same identity. Sent again with the same key, the
    new body is refused 422, naming the job the key holds: that job is the row's, collected
    with a warning, and nothing is sent under another key. Before, the row was a final `error`
    — a paid job left behind, and the advice of a new identity a second payment."""
    m = tmp_path / "m.jsonl"
    rows = write_manifest(m, {"a": {"prompt": "a", "n": 1}, "b": {"prompt": "b", "n": 1}})
    c = KeyHoldingClient({}, lose={"a"})
    r = runner(c, batch.State(str(tmp_path / "s.sqlite")), rows, tmp_path)
    r.run()
    assert [x["state"] for x in r.results(str(tmp_path / "res.jsonl"))] == \
        ["submitting", "completed"]
    job_a = "job_" + rows[0].key[:12]
    assert job_a in c.jobs, "the gateway made the job; only its answer was lost"
    rows = write_manifest(m, {"a": {"prompt": "a", "n": 2}, "b": {"prompt": "b", "n": 1}})
    r2 = runner(c, batch.State(str(tmp_path / "s.sqlite")), rows, tmp_path)
    r2.run()
    out = r2.results(str(tmp_path / "res.jsonl"))
    a = out[0]
    assert a["state"] == "completed" and a["job_id"] == job_a and not a["error"], a
    assert c.submits == [rows[0].key, rows[1].key, rows[0].key], "the same key, never another"
    assert c.bodies[-1]["n"] == 2
    err = r2.err.getvalue()
    assert "line 1: the body changed since it was sent" in err and job_a in err, err
    line = json.loads(open(tmp_path / "res.jsonl").readline())
    assert "earlier body's job" in line["warning"], line
    assert batch.exit_code(out, False) == batch.EXIT_OK
    # Every later run warns, sends nothing and leaves the row alone.
    r3 = runner(c, batch.State(str(tmp_path / "s.sqlite")), rows, tmp_path)
    r3.run()
    assert "changed since an earlier run" in r3.err.getvalue(), r3.err.getvalue()
    assert len(c.submits) == 3
    assert [x["state"] for x in r3.results(str(tmp_path / "res.jsonl"))] == ["completed"] * 2


@pytest.mark.parametrize("detail", [
    None,  # a row this state file never sent: the key was used elsewhere (another state file)
    "this key already belongs to job ?, whose request had another body",  # no job named
])
def test_a_422_that_names_no_job_of_this_rows_is_the_rows_error(tmp_path, detail):
    m = tmp_path / "m.jsonl"
    rows = write_manifest(m, {"a": {"prompt": "a", "n": 2}})
    c = KeyHoldingClient({})
    key = rows[0].key
    c.held[key] = json.dumps({"prompt": "a", "n": 1}, sort_keys=True)
    state = batch.State(str(tmp_path / "s.sqlite"))
    state.load(rows)
    if detail is not None:
        state.update(key, state=batch.SUBMITTING, submits=1)
        orig = c.submit

        def no_job_named(*a, **k):
            try:
                return orig(*a, **k)
            except KeyReused as e:
                e.problem["detail"] = detail
                raise
        c.submit = no_job_named
    r = runner(c, state, rows, tmp_path)
    r.run()
    [out] = r.results(str(tmp_path / "res.jsonl"))
    assert out["state"] == "error" and "idempotency-key-reused" in out["error"], out
    assert out["job_id"] is None and c.submits == [key]
    assert batch.exit_code([out], False) == batch.EXIT_FAILED


# --- CSV manifests ------------------------------------------------------------------------------

def test_a_csv_manifest_is_the_same_rows_as_its_jsonl(tmp_path):
    """Dotted column names place each cell; typed columns convert it; an empty cell leaves its
    member out. The CSV rows derive the keys the equivalent JSONL rows derive."""
    (tmp_path / "m.csv").write_text(
        "route,identity.sku,identity.variant:int,body.prompt,body.n:int,body.hd:bool,"
        "body.extra:json,note\n"
        'p/r,sku-1,1,"a poster, with a comma",2,true,"{""seed"": 7}",x\n'
        "p/r,sku-2,1,plain,,false,,\n"
        "\n")
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(o) + "\n" for o in [
        {"route": "p/r", "identity": {"sku": "sku-1", "variant": 1},
         "body": {"prompt": "a poster, with a comma", "n": 2, "hd": True, "extra": {"seed": 7}}},
        {"route": "p/r", "identity": {"sku": "sku-2", "variant": 1},
         "body": {"prompt": "plain", "hd": False}}]))
    from_csv = batch.read_manifest(str(tmp_path / "m.csv"))
    from_jsonl = batch.read_manifest(str(tmp_path / "m.jsonl"))
    assert [(r.route, r.body, r.key) for r in from_csv] == \
        [(r.route, r.body, r.key) for r in from_jsonl]
    assert [r.line for r in from_csv] == [2, 3], "a row's line is its line in the file"


def test_csv_by_flag_key_fields_and_route_option(tmp_path):
    m = tmp_path / "rows.txt"
    m.write_text("sku,body:json\nsku-1,\"{\"\"prompt\"\": \"\"x\"\"}\"\n")
    with pytest.raises(batch.ManifestError, match="not JSON"):
        batch.read_manifest(str(m), "p/r", ["sku"])  # by extension: JSONL
    [row] = batch.read_manifest(str(m), "p/r", ["sku"], fmt="csv")
    assert row.body == {"prompt": "x"} and row.route == "p/r"


@pytest.mark.parametrize("text,err", [
    ("route,body.n:number\n", "column 'body.n:number'"),
    ("route,body,body.prompt\np/r,x,y\n", "overlap"),
    ("route,identity.a,body.n:int\np/r,1,two\n", "m.csv:2: column 'body.n:int'"),
    ("route,identity.a,body.p\np/r,1\n", "m.csv:2: 2 cells"),
    ("route,identity.a\np/r,1\n", "m.csv:2: a row is an object with a \"body\" object"),
    ("route,identity.a,body.p\n", "no rows"),
])
def test_csv_errors_name_the_line_and_column(tmp_path, text, err):
    (tmp_path / "m.csv").write_text(text)
    with pytest.raises(batch.ManifestError) as e:
        batch.read_manifest(str(tmp_path / "m.csv"))
    assert err in str(e.value)


# --- the command line ---------------------------------------------------------------------------

def test_a_resume_whose_keys_all_changed_is_refused(tmp_path, monkeypatch, capsys):
    """A run resumed with another --key-prefix (or --key-fields) makes every key anew: each row,
    the finished ones too, would be a second paid job. It is refused before anything is sent
    (before, it ran every row again without a word of resuming)."""
    m = tmp_path / "m.jsonl"
    m.write_text("".join(json.dumps({"route": "p/r", "identity": {"p": p}, "body": {"prompt": p}})
                         + "\n" for p in ("a", "b")))
    state = str(tmp_path / "s.sqlite")
    batch.State(state).load(batch.read_manifest(str(m), key_prefix="poster-"))
    monkeypatch.setenv("IDEMGATE_TOKEN", "tok")
    argv = ["run", str(m), "--state", state, "--url", "http://127.0.0.1:9", "--retries", "1",
            "--no-download", "--results", str(tmp_path / "r.jsonl")]
    assert batch.main(argv + ["--key-prefix", "post-"]) == batch.EXIT_USAGE
    err = capsys.readouterr().err
    assert "holds 2 rows of an earlier run and none of this manifest's keys" in err, err
    assert batch.State(state).count() == 2, "nothing was added to the state"

def test_help_shows_every_default_and_both_formats(capsys):
    for argv in (["--help"], ["run", "--help"]):
        with pytest.raises(SystemExit) as e:
            batch.main(argv)
        assert e.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "CSV" in text and "JSONL" in text
        for opt, default in (("--concurrency", "2"), ("--wait", "20"), ("--row-timeout", "600"),
                             ("--archive-timeout", "120"), ("--retries", "6"),
                             ("--format", "auto"), ("--state", "MANIFEST.state.sqlite"),
                             ("--results", "MANIFEST.results.jsonl"),
                             ("--out", "MANIFEST.outputs/"), ("--no-download", "download them")):
            assert f"{opt}" in text and f"(default: {default})" in text, (argv, opt)


def test_a_run_says_when_it_resumes_from_an_earlier_runs_state(tmp_path):
    rows, state, c = make(tmp_path, ["a", "b", "c"], {"b": Unavailable("503", key="k")})
    first = runner(c, state, rows[:2], tmp_path)
    first.run()
    assert "resuming" not in first.err.getvalue(), "a first run has nothing to resume"
    c.script = {}
    again = runner(c, batch.State(str(tmp_path / "s.sqlite")), rows, tmp_path)
    again.run()
    said = [line for line in again.err.getvalue().splitlines() if "resuming" in line]
    assert len(said) == 1, again.err.getvalue()
    line = said[0]
    assert str(tmp_path / "s.sqlite") in line and "2 of 3 rows known, 1 new" in line, line
    assert "1 finished (left alone)" in line and "1 in doubt" in line, line
    assert "1 not sent yet" in line, line
