"""The batch runner's bookkeeping on a scripted client (no gateway, no network): spend, the
run stopped by a held-back job, a row left for the next run and resumed with the same key,
outputs recorded. The runner against the real gateway (kill -9, one create per row) is in
tests/integration/test_python_client.py."""

import io
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from idemgate import Job, Output, Unavailable, Unknown, batch  # noqa: E402


class FakeClient:
    """Plays the gateway: script(row_prompt) -> what submit does for that row."""

    def __init__(self, script):
        self.script, self.submits, self.jobs = script, [], {}

    def submit(self, route, body, key, wait=None):
        self.submits.append(key)
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

    def outputs(self, job, dest):
        return [Output(0, os.path.join(dest, "0"), "ab" * 32, 3, "image/png")]


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
