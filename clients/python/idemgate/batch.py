"""idemgate-batch: run a manifest of generations (JSONL or CSV) through idemgate, never paying
twice.

    IDEMGATE_TOKEN=… idemgate-batch run manifest.jsonl [--url URL] [--concurrency 2] …
    IDEMGATE_TOKEN=… idemgate-batch run manifest.csv --route provider/route --key-fields sku

JSONL (the default): each line is a JSON object: {"body": {…}, "route": "provider/route" (or
--route), "identity": {…}} — or, instead of "identity", the members named by --key-fields.

CSV (a manifest named *.csv, or --format csv): a header line, then one row per line. A column's
name is where its cell goes in the row's object, dotted: `route`, `identity.sku`,
`body.prompt`, `body.size`; other columns (`sku`) can be named by --key-fields. A cell is a
string; a `:int`, `:float`, `:bool` or `:json` suffix on the column name converts it
(`body.n:int`, `body:json` for a whole body in one cell); an empty cell leaves its member out.
So `route,identity.sku,body.prompt,body.n:int` rows are the JSONL rows
{"route": …, "identity": {"sku": …}, "body": {"prompt": …, "n": 1}}.

The row's Idempotency-Key is derived from its route and identity (idemgate.derive_key), so the
same row always has the same key, in this run, the next one, or another machine's.

State lives in a SQLite file beside the manifest (--state). A row is written there as
`submitting` and committed BEFORE its request leaves, then `submitted` with its job id, then
its final state. So a run killed at any moment (kill -9 included) and started again resumes
where it was — and says so on stderr: a row that was being submitted is submitted again with
the same key (the gateway answers with the job it already has: nothing is created twice), a row
with a job id is only waited for, a finished row is left alone.

A row's 400/404/422 is that row's error (but for a 422 to a row in doubt, below); a 401 (the
token) or a 402 (the budget, or the provider's account: a job failed with the provider's
401/402, or held back because the provider's credential is tripped) stops the whole run — every
next row would fail the same way.

Outputs of completed jobs are downloaded from the gateway's archive (GET
/v1/jobs/{id}/outputs/{n}, Client.outputs: waiting up to --archive-timeout for the copies) into
--out, each checked against its SHA-256 and saved with its type's extension, when the gateway
archives outputs; otherwise the results name the provider's outputs as the job shows them. A
completed job whose copies are still being made when the wait runs out is not finished: the row
stays `submitted` (note: run again), and the next run reads its job again and downloads them. So
does one whose downloaded bytes did not match their SHA-256 (IntegrityError: discarded, the
error in the row's `error`): before, that row was `completed`, final, and never downloaded again.

A row's body is compared with the earlier run's by its canonical JSON (members sorted), as the
gateway compares requests: reordered members or CSV columns are the same row. A row whose body
really changed but whose identity did not: not sent yet, it is sent with the new body; with a
job, it keeps that job (its key holds it: the gateway would refuse the new body with a 422),
which is waited for and collected as before, with a warning on stderr and in the results. In
doubt (sent, its answer lost), it is sent again with the new body under the same key: the
gateway creates it (the earlier request never arrived), or its 422 names the job the key holds,
made from the earlier body, and the row keeps and collects that job, with the same warnings —
never a final error, never a new key (before, the row was a final `error`). A new output needs
a new identity.

A job cancelled meanwhile (by someone else: the runner never cancels) that the provider ended
is the row's final state `canceled`, with its spend: it is not failed, and not sent again.

At the end: a summary table on stdout and a results JSONL (--results), one line per row.
Exit status: 0 every row completed · 1 some row failed, was canceled or was refused · 2 the run
was stopped (401/402) · 3 the manifest or the options are wrong · 4 some rows are not finished
yet, their outputs not downloaded included (run again: they resume).
"""

import argparse
import csv
import hashlib
import json
import os
import queue
import re
import sqlite3
import sys
import threading
import time

from . import policy
from .client import Client
from .errors import (IdemgateError, IntegrityError, KeyReused, OutputsUnavailable, Rejected,
                     Unknown)
from .keys import derive_key

EXIT_OK, EXIT_FAILED, EXIT_STOPPED, EXIT_USAGE, EXIT_UNFINISHED = 0, 1, 2, 3, 4

# Runner states of a row. Final: completed, failed, canceled (the job's own outcome), error
# (refused).
PENDING, SUBMITTING, SUBMITTED = "pending", "submitting", "submitted"
COMPLETED, FAILED, CANCELED, ERROR = "completed", "failed", "canceled", "error"
FINAL = (COMPLETED, FAILED, CANCELED, ERROR)

SCHEMA = """
CREATE TABLE IF NOT EXISTS rows (
    key          TEXT PRIMARY KEY,
    line         INTEGER NOT NULL,
    route        TEXT NOT NULL,
    body_sha256  TEXT NOT NULL,
    state        TEXT NOT NULL,
    job_id       TEXT,
    job_state    TEXT,
    submits      INTEGER NOT NULL DEFAULT 0,
    error        TEXT,
    spend_micros INTEGER,
    currency     TEXT,
    outputs      TEXT,
    note         TEXT,
    updated_at   REAL NOT NULL
);
"""


class ManifestError(Exception):
    pass


# The note of a completed row whose outputs are still being archived. Versions before this one
# recorded such a row as `completed` with this note: a run finding one goes back to its job.
OUTPUTS_PENDING = "outputs not archived yet (pending): run again to download them"

# The note of a completed row whose downloaded bytes did not match their SHA-256 (discarded; the
# error column says which output): not final, the next run downloads them again. Versions
# before this one recorded such a row as `completed`, final, with the error in its note.
OUTPUTS_MISMATCH = "outputs did not match their SHA-256 (discarded): run again to download them"

# The body hash stored for a row whose key's job the gateway says was made from another body
# (422) when this state file holds no other hash for it: never a body's hash, so every run and
# the results warn.
OTHER_BODY = "another body (422 idempotency-key-reused)"

# The job that holds a key, as the gateway's 422 idempotency-key-reused names it in its detail
# ("this key already belongs to job job_…, whose request had another body; …").
_KEY_HOLDER = re.compile(r"\bbelongs to job ([A-Za-z0-9_]{1,64})\b")


def key_holder(problem):
    """The id of the job that holds the key, named by a 422 idempotency-key-reused problem
    document (its `job_id` member if it has one, else its detail), or None."""
    if not isinstance(problem, dict):
        return None
    if isinstance(problem.get("job_id"), str) and problem["job_id"]:
        return problem["job_id"]
    m = _KEY_HOLDER.search(problem.get("detail") or "")
    return m.group(1) if m else None


def _sha256_json(body, sort_keys):
    text = json.dumps(body, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


class Row:
    def __init__(self, line, route, body, key):
        self.line, self.route, self.body, self.key = line, route, body, key
        self.body_bytes = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        # The gateway takes the same members in another order (or spacing) for the same
        # request, so whether a row's body changed is asked of its canonical form: a manifest
        # regenerated with reordered members, or a CSV with reordered columns, is the same rows.
        self.body_sha256 = _sha256_json(body, sort_keys=True)
        # Earlier versions stored the hash of the members in the manifest's order: a stored
        # hash equal to that is this same body, not a changed one.
        self.unsorted_sha256 = _sha256_json(body, sort_keys=False)


def _field(row, name):
    cur = row
    for part in name.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise KeyError(name)
        cur = cur[part]
    return cur


CSV_TYPES = ("str", "int", "float", "bool", "json")


def manifest_format(path, fmt="auto"):
    """"jsonl" or "csv": fmt itself, or with "auto" by the file's extension (.csv: CSV)."""
    if fmt in ("jsonl", "csv"):
        return fmt
    if fmt != "auto":
        raise ManifestError(f"--format {fmt}: auto, jsonl or csv")
    return "csv" if path.lower().endswith(".csv") else "jsonl"


def _jsonl_objects(path):
    with open(path, encoding="utf-8") as f:
        for n, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                yield n, json.loads(text)
            except ValueError as e:
                raise ManifestError(f"{path}:{n}: not JSON: {e}") from None


def _csv_column(path, name):
    """(dotted parts, type) of a CSV header cell `a.b[:type]`."""
    where, _, typ = name.strip().partition(":")
    typ = typ.strip() or "str"
    parts = where.strip().split(".")
    if typ not in CSV_TYPES or not all(p.strip() for p in parts):
        raise ManifestError(f"{path}:1: column {name!r}: a dotted name (body.prompt) with an "
                            f"optional type ({', '.join(':' + t for t in CSV_TYPES)})")
    return [p.strip() for p in parts], typ


def _csv_cell(cell, typ):
    if typ == "str":
        return cell
    if typ == "int":
        return int(cell.strip())
    if typ == "float":
        return float(cell.strip())
    if typ == "bool":
        v = cell.strip().lower()
        if v in ("true", "yes", "1"):
            return True
        if v in ("false", "no", "0"):
            return False
        raise ValueError(f"{cell!r} is not true/false")
    return json.loads(cell)


def _csv_objects(path):
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            return
        cols = [_csv_column(path, h) for h in header]
        names = [".".join(p) for p, _ in cols]
        for i, a in enumerate(names):
            for b in names[:i]:
                if a == b or a.startswith(b + ".") or b.startswith(a + "."):
                    raise ManifestError(f"{path}:1: columns {b!r} and {a!r} overlap")
        for cells in reader:
            n = reader.line_num
            if not any(c.strip() for c in cells):
                continue
            if len(cells) != len(cols):
                raise ManifestError(f"{path}:{n}: {len(cells)} cells; the header has "
                                    f"{len(cols)} columns")
            obj = {}
            for (parts, typ), name, cell in zip(cols, header, cells):
                if cell == "":
                    continue
                try:
                    value = _csv_cell(cell, typ)
                except ValueError as e:
                    raise ManifestError(f"{path}:{n}: column {name.strip()!r}: {e}") from None
                cur = obj
                for p in parts[:-1]:
                    cur = cur.setdefault(p, {})
                cur[parts[-1]] = value
            yield n, obj


def read_manifest(path, default_route=None, key_fields=None, key_prefix="", fmt="auto"):
    """The manifest's rows (JSONL or CSV: manifest_format), each with its derived key. Raises
    ManifestError naming the line."""
    rows, seen = [], {}
    kind = manifest_format(path, fmt)
    objects = _csv_objects(path) if kind == "csv" else _jsonl_objects(path)
    for n, obj in objects:
        if not isinstance(obj, dict) or not isinstance(obj.get("body"), dict):
            raise ManifestError(f"{path}:{n}: a row is an object with a \"body\" object"
                                + (" (CSV: body.* columns, or a body:json column)"
                                   if kind == "csv" else ""))
        route = obj.get("route", default_route)
        if not isinstance(route, str) or route.count("/") < 1:
            raise ManifestError(f"{path}:{n}: no \"route\" (provider/route) and no --route")
        if isinstance(obj.get("identity"), dict):
            identity = obj["identity"]
        elif key_fields:
            try:
                identity = {k: _field(obj, k) for k in key_fields}
            except KeyError as e:
                raise ManifestError(f"{path}:{n}: the row has no {e.args[0]} "
                                    "(named by --key-fields)") from None
        else:
            raise ManifestError(f"{path}:{n}: no \"identity\" object and no --key-fields: "
                                "a key must come from what the output is, not from chance")
        try:
            key = derive_key({"route": route.strip("/"), "identity": identity},
                             prefix=key_prefix)
        except (TypeError, ValueError) as e:
            raise ManifestError(f"{path}:{n}: identity: {e}") from None
        row = Row(n, route.strip("/"), obj["body"], key)
        if key in seen:
            first = seen[key]
            what = "the same request" if first.body_sha256 == row.body_sha256 else \
                "another body (the identity misses what differs)"
            raise ManifestError(f"{path}:{n}: same identity as line {first.line}, with {what}")
        seen[key] = row
        rows.append(row)
    if not rows:
        raise ManifestError(f"{path}: no rows")
    return rows


class State:
    """The SQLite file. Every write is committed before the call returns (synchronous=FULL)."""

    def __init__(self, path):
        self.path = path
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.lock = threading.Lock()
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)

    def known(self, rows):
        """How many of rows an earlier run already wrote here."""
        keys = [r.key for r in rows]
        n = 0
        with self.lock:
            for i in range(0, len(keys), 500):
                part = keys[i:i + 500]
                n += self.db.execute(f"SELECT count(*) FROM rows WHERE key IN "
                                     f"({','.join('?' * len(part))})", part).fetchone()[0]
        return n

    def count(self):
        """How many rows the file holds, of any manifest."""
        with self.lock:
            return self.db.execute("SELECT count(*) FROM rows").fetchone()[0]

    def load(self, rows):
        """Adds rows not seen before as pending; returns {key: dict of the stored row}."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            for r in rows:
                self.db.execute("INSERT OR IGNORE INTO rows (key, line, route, body_sha256, state, "
                                "updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                                (r.key, r.line, r.route, r.body_sha256, PENDING, time.time()))
            self.db.execute("COMMIT")
            cur = self.db.execute("SELECT * FROM rows")
            names = [d[0] for d in cur.description]
            return {t[0]: dict(zip(names, t)) for t in cur.fetchall()}

    def update(self, key, **cols):
        cols["updated_at"] = time.time()
        sets = ", ".join(f"{c} = ?" for c in cols)
        with self.lock:
            self.db.execute(f"UPDATE rows SET {sets} WHERE key = ?", (*cols.values(), key))

    def mark_submitting(self, key):
        """Committed before the request leaves."""
        with self.lock:
            self.db.execute("UPDATE rows SET state = ?, submits = submits + 1, updated_at = ? "
                            "WHERE key = ?", (SUBMITTING, time.time(), key))

    def counts(self):
        with self.lock:
            return dict(self.db.execute("SELECT state, count(*) FROM rows GROUP BY state"))

    def spend(self):
        """{currency: settled micros} over the rows whose job reported a cost."""
        with self.lock:
            return dict(self.db.execute("SELECT currency, sum(spend_micros) FROM rows WHERE "
                                        "spend_micros IS NOT NULL AND currency IS NOT NULL "
                                        "GROUP BY currency"))

    def all(self):
        with self.lock:
            cur = self.db.execute("SELECT * FROM rows ORDER BY line")
            names = [d[0] for d in cur.description]
            return [dict(zip(names, t)) for t in cur.fetchall()]


class Runner:
    def __init__(self, client, state, rows, out_dir, concurrency=2, wait=20, row_timeout=600,
                 download=True, archive_timeout=120, err=sys.stderr, progress_every=1.0):
        self.client, self.state, self.rows = client, state, rows
        self.out_dir, self.concurrency, self.wait_s = out_dir, max(1, concurrency), wait
        self.row_timeout, self.download, self.archive_timeout = row_timeout, download, archive_timeout
        self.err, self.progress_every = err, progress_every
        self.stop = threading.Event()
        self.stop_reason = None
        self.lock = threading.Lock()
        self.running = 0
        self.done_this_run = 0

    # -- one row ----------------------------------------------------------------------------

    def _stop_run(self, why):
        with self.lock:
            if self.stop_reason is None:
                self.stop_reason = why
        self.stop.set()

    def _finish(self, row, job):
        """Records a terminal job: its state, spend, and (completed) its outputs."""
        spend = job.spend
        cols = {"state": COMPLETED if job.ok else CANCELED if job.canceled else FAILED,
                "job_id": job.id, "job_state": job.state,
                "spend_micros": spend[0] if spend else None,
                "currency": spend[1] if spend else None}
        if job.ok:
            cols["outputs"], cols["note"], cols["error"] = self._outputs(row, job)
            if cols["note"] in (OUTPUTS_PENDING, OUTPUTS_MISMATCH):
                # Paid for but not in hand: not final, so that the next run reads the job again
                # and downloads its outputs (never a new submit: the row keeps its job id), and
                # the exit status says to run again.
                cols["state"] = SUBMITTED
        elif job.canceled:  # the provider ended its task on a cancel: no result, maybe a cost
            cols["note"] = f"canceled (task {job.remote_id}): {job.get('last_error')}"
        else:
            cols["error"] = job.get("last_error") or \
                f"provider status {(job.get('result') or {}).get('status')}"
        self.state.update(row.key, **cols)
        if policy.must_stop_run(job=job.data):
            status = (job.get("result") or {}).get("status")
            self._stop_run(f"line {row.line}: job {job.id} "
                           + (f"was refused by the provider's account ({status})" if status in (401, 402)
                              else f"is held back: {(job.get('blocked') or {}).get('reason')}"))

    def _outputs(self, row, job):
        """(outputs JSON, note, error) of a completed job: its archived outputs, downloaded and
        checked (Client.outputs, waiting up to archive_timeout for the copies, in slices so that
        a stopped run lets go). Bytes that do not match their SHA-256 are the note
        OUTPUTS_MISMATCH and the error naming the output: the next run downloads them again."""
        if not self.download:
            return None, "download off", None
        if not isinstance(job.get("archive"), list):
            body = (job.get("result") or {}).get("body")
            urls = [d.get("url") for d in (body.get("data") or []) if isinstance(d, dict)
                    and d.get("url")] if isinstance(body, dict) else []
            return json.dumps([{"index": i, "url": u} for i, u in enumerate(urls)]), \
                "no archive on this gateway: provider URLs only, not downloaded", None
        dest = os.path.join(self.out_dir, f"{row.line:06d}-{row.key[:24]}")
        deadline = time.monotonic() + self.archive_timeout
        while True:
            left = deadline - time.monotonic()
            try:
                got = self.client.outputs(job, dest, timeout=max(0.0, min(5.0, left)))
            except OutputsUnavailable as e:
                if not e.pending:
                    return None, f"outputs: {e}", None
                if left <= 5.0 or self.stop.is_set():
                    return None, OUTPUTS_PENDING, None
                continue
            except IntegrityError as e:
                # The bytes were discarded, not the job's outputs: a download again can match
                # (a corrupted transfer, a proxy's). Before, the row was `completed`, final,
                # and no run downloaded them again.
                return None, OUTPUTS_MISMATCH, f"outputs: {e}"
            return json.dumps([o.as_dict() for o in got]), None, None

    def _wait(self, row, job):
        """Waits for the job in slices, so that a stopped run lets go at once."""
        deadline = time.monotonic() + self.row_timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return self.client.wait(job, timeout=max(0.0, min(5.0, left)))
            except Unknown as e:
                self.state.update(row.key, job_state=e.state)
                if e.job is not None and policy.must_stop_run(job=e.job.data):
                    self._stop_run(f"line {row.line}: job {e.job_id} is held back: "
                                   f"{(e.job.get('blocked') or {}).get('reason')}")
                if left <= 5.0 or self.stop.is_set():
                    raise
                job = e.job
                job.submission = None  # waited once with Prefer: wait; now by reads

    def _follow_key_holder(self, row, stored, e):
        """A row in doubt (an earlier run sent it and lost the answer) sent again with a body
        that changed since: the gateway's 422 names the job its key already holds, made from
        the earlier body. That job is the row's — paid for, or on its way —: it is recorded
        and collected like any row with a job, with a warning, never submitted under another
        key. Returns the Job, or None when the 422 is the row's error: a row this state file
        never sent (the key was used elsewhere) or a problem that names no job."""
        job_id = key_holder(e.problem) if stored["state"] == SUBMITTING else None
        if job_id is None:
            return None
        earlier = stored["body_sha256"]
        cols = {"state": SUBMITTED, "job_id": job_id,
                "body_sha256": earlier if earlier != row.body_sha256 else OTHER_BODY,
                "note": f"the key already holds job {job_id}, made from another body (422 to "
                        "this one): that job is collected"}
        self.state.update(row.key, **cols)
        stored.update(cols)
        print(f"idemgate-batch: warning: line {row.line}: the body changed since it was sent, "
              f"the identity did not: the gateway refused the new body (422); its key already "
              f"holds job {job_id}, made from the earlier body, which is collected instead. A "
              "new output needs a new identity.", file=self.err, flush=True)
        return self.client.get(job_id)

    def run_row(self, row, stored):
        try:
            if stored["job_id"]:
                job = self.client.get(stored["job_id"])
            else:
                if self.stop.is_set():
                    return
                self.state.mark_submitting(row.key)      # committed BEFORE the request leaves
                try:
                    job = self.client.submit(row.route, row.body_bytes, row.key,
                                             wait=self.wait_s)
                except KeyReused as e:
                    job = self._follow_key_holder(row, stored, e)
                    if job is None:
                        raise
                else:
                    # This body is the one the key's job was made from (created, or replayed).
                    self.state.update(row.key, state=SUBMITTED, job_id=job.id,
                                      job_state=job.state, body_sha256=row.body_sha256,
                                      note="replayed" if job.replayed else None)
            job = self._wait(row, job)
            self._finish(row, job)
        except Unknown as e:
            self.state.update(row.key, note=f"not finished: job {e.job_id} is {e.state}; run again "
                                            "to resume")
        except IdemgateError as e:
            if policy.must_stop_run(exc=e):
                self._stop_run(f"line {row.line}: {e}")
                # Refused at intake (token, budget): nothing was recorded for this key.
                self.state.update(row.key, state=PENDING if not stored["job_id"] else SUBMITTED,
                                  note=f"stopped: {e}")
            elif isinstance(e, Rejected):
                self.state.update(row.key, state=ERROR, error=str(e))
            else:  # Unavailable, RateLimited: nothing decided; the next run sends the same key
                self.state.update(row.key, note=f"gave up for now: {e}")
        finally:
            with self.lock:
                self.done_this_run += 1

    # -- the run ------------------------------------------------------------------------------

    def counts(self):
        return self.state.counts()

    def spend(self):
        return self.state.spend()

    def progress_line(self, started, todo):
        c = self.counts()
        total = len(self.rows)
        final = sum(c.get(s, 0) for s in FINAL)
        elapsed = max(time.monotonic() - started, 1e-6)
        rate = self.done_this_run / elapsed
        left = todo - self.done_this_run
        eta = f"{_hms(left / rate)}" if rate > 0 and left > 0 else ("0:00:00" if left <= 0 else "?")
        width = 20
        filled = int(width * final / total) if total else width
        states = " ".join(f"{s} {c[s]}" for s in (PENDING, SUBMITTING, SUBMITTED, COMPLETED,
                                                   FAILED, CANCELED, ERROR) if c.get(s))
        spend = self.spend()
        money = " · spend " + ", ".join(f"{_money(v)} {k}" for k, v in sorted(spend.items())) \
            if spend else ""
        return (f"[{'#' * filled}{'.' * (width - filled)}] {final}/{total} "
                f"· {rate:.2f} rows/s · ETA {eta} · {states}{money}")

    def _reconcile(self, row, s):
        """Brings the stored row s (updated in place) up to this manifest and this version;
        returns whether its body changed while its key holds a job."""
        def update(**cols):
            self.state.update(row.key, **cols)
            s.update(cols)
        if s["body_sha256"] == row.unsorted_sha256 != row.body_sha256:
            update(body_sha256=row.body_sha256)  # an earlier version's hash of this same body
        if s["state"] == COMPLETED and s["job_id"] and s["outputs"] is None \
                and s["note"] == OUTPUTS_PENDING:
            update(state=SUBMITTED)  # an earlier version took it for final: collect it now
        if s["state"] == COMPLETED and s["job_id"] and s["outputs"] is None \
                and _earlier_mismatch(s["note"]):
            # An earlier version took discarded bytes for final: download them again now.
            update(state=SUBMITTED, note=OUTPUTS_MISMATCH, error=s["note"])
        if s["body_sha256"] == row.body_sha256:
            return False
        if s["job_id"]:
            # The key holds that job, made from the earlier body, and the gateway refuses the
            # new body under it (422). Calling the row an error would leave a paid job
            # uncollected and invite a new identity, a second payment: keep collecting the job,
            # and keep its body's hash so that every run warns.
            return True
        if s["state"] == PENDING:
            # Not sent: sent with the new body.
            update(body_sha256=row.body_sha256)
        # In doubt (SUBMITTING): sent again with the new body under the same key. The gateway
        # either creates it (the earlier request never arrived: run_row records the new body's
        # hash) or answers 422 naming the job the key holds, made from the earlier body: run_row
        # collects that job, and the earlier body's hash kept here makes every run warn.
        return False

    def run(self):
        earlier = self.state.known(self.rows)
        stored = self.state.load(self.rows)
        changed = [r for r in self.rows if self._reconcile(r, stored[r.key])]
        if earlier:
            print(resume_line(self.state.path, earlier, len(self.rows),
                              [stored[r.key] for r in self.rows]), file=self.err, flush=True)
        if changed:
            lines = ", ".join(str(r.line) for r in changed[:10]) + (", …" if changed[10:] else "")
            print(f"idemgate-batch: warning: the body changed since an earlier run but not the "
                  f"identity on {len(changed)} row(s) (lines {lines}): each keeps the job its "
                  "key already holds, made from the earlier body, and collects it (the gateway "
                  "would refuse the new body: 422). A new output needs a new identity.",
                  file=self.err, flush=True)
        todo = []
        for r in self.rows:
            s = stored[r.key]
            if s["state"] not in FINAL:
                todo.append((r, s))
        started = time.monotonic()
        work = queue.Queue()
        for t in todo:
            work.put(t)

        def worker():
            while not self.stop.is_set():
                try:
                    r, s = work.get_nowait()
                except queue.Empty:
                    return
                self.run_row(r, s)

        threads = [threading.Thread(target=worker, daemon=True)
                   for _ in range(min(self.concurrency, max(1, len(todo))))]
        for t in threads:
            t.start()
        last = ""
        tty = self.err.isatty() if hasattr(self.err, "isatty") else False
        while True:
            alive = [t for t in threads if t.is_alive()]
            if not alive:
                break
            alive[0].join(timeout=self.progress_every)
            line = self.progress_line(started, len(todo))
            if line != last:
                print(("\r" if tty else "") + line, end="" if tty else "\n", file=self.err,
                      flush=True)
                last = line
        line = self.progress_line(started, len(todo))
        if line != last:
            print(("\r" if tty else "") + line, file=self.err, flush=True)
        elif tty:
            print(file=self.err, flush=True)  # end the line the bar was redrawn on
        return time.monotonic() - started

    def results(self, path):
        """Writes the results JSONL (atomically) and returns the rows."""
        rows = self.state.all()
        by_key = {r["key"]: r for r in rows}
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for row in self.rows:
                r = by_key[row.key]
                out = {"line": row.line, "key": row.key, "route": row.route, "state": r["state"],
                       "job_id": r["job_id"], "job_state": r["job_state"], "submits": r["submits"]}
                if r["error"]:
                    out["error"] = r["error"]
                if r["note"]:
                    out["note"] = r["note"]
                if r["job_id"] and r["body_sha256"] != row.body_sha256:
                    out["warning"] = ("the row's body changed since its job was made, its "
                                      "identity did not: this is the earlier body's job")
                if r["outputs"]:
                    out["outputs"] = json.loads(r["outputs"])
                if r["spend_micros"] is not None:
                    out["spend"] = {"micros": r["spend_micros"], "currency": r["currency"]}
                f.write(json.dumps(out, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return [by_key[row.key] for row in self.rows]


def _earlier_mismatch(note):
    """Whether note is what versions before OUTPUTS_MISMATCH wrote, as final, for downloaded
    bytes that did not match their SHA-256 (an IntegrityError's message)."""
    return isinstance(note, str) and note.startswith("outputs: output ") and \
        note.endswith("; the download was discarded")


def resume_line(state_path, earlier, total, stored):
    """What a run resuming from an earlier run's state will do, for stderr."""
    c = {}
    for r in stored:
        c[r["state"]] = c.get(r["state"], 0) + 1
    parts = [f"{sum(c.get(s, 0) for s in FINAL)} finished (left alone)"]
    if c.get(SUBMITTING):
        parts.append(f"{c[SUBMITTING]} in doubt (sent again with the same key: the gateway "
                     "replays, nothing is created twice)")
    if c.get(SUBMITTED):
        parts.append(f"{c[SUBMITTED]} with a job (waited for, not sent again)")
    if c.get(PENDING):
        parts.append(f"{c[PENDING]} not sent yet")
    new = total - earlier
    return (f"idemgate-batch: resuming from {state_path} (the state of an earlier run: "
            f"{earlier} of {total} rows known{f', {new} new' if new else ''}): "
            + ", ".join(parts))


def _hms(seconds):
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _money(micros):
    return f"{micros / 1_000_000:.6f}".rstrip("0").rstrip(".")


def summary_table(rows, stop_reason, elapsed, spend, results_path):
    counts = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    lines = [f"{'state':<12}{'rows':>8}"]
    for s in (COMPLETED, FAILED, CANCELED, ERROR, SUBMITTED, SUBMITTING, PENDING):
        if counts.get(s):
            label = {SUBMITTED: "unfinished", SUBMITTING: "in doubt", PENDING: "not sent"}.get(s, s)
            lines.append(f"{label:<12}{counts[s]:>8}")
    lines.append(f"{'total':<12}{len(rows):>8}")
    for cur, v in sorted(spend.items()):
        lines.append(f"{'spend':<12}{_money(v):>8} {cur}")
    lines.append(f"{'elapsed':<12}{_hms(elapsed):>8}")
    lines.append(f"results     {results_path}")
    if stop_reason:
        lines.append(f"STOPPED: {stop_reason}")
    return "\n".join(lines)


def exit_code(rows, stopped):
    if stopped:
        return EXIT_STOPPED
    states = {r["state"] for r in rows}
    # Unfinished first: a job still running is paid and its result is collected only by running
    # again — a wrapper that reruns while the code is 4 must not stop at a failed row beside it.
    if states - {COMPLETED, FAILED, CANCELED, ERROR}:
        return EXIT_UNFINISHED
    if states & {FAILED, CANCELED, ERROR}:
        return EXIT_FAILED
    return EXIT_OK


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the descriptions' line breaks; wide enough for the option lines."""

    def __init__(self, prog):
        super().__init__(prog, max_help_position=30, width=100)


def parser():
    ap = argparse.ArgumentParser(
        prog="idemgate-batch", formatter_class=_HelpFormatter,
        description="Run a manifest of generations (JSONL or CSV) through idemgate, resumably: "
                    "each row's\nIdempotency-Key comes from its identity, so no row is paid "
                    "twice, whatever happens.")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{run}")
    r = sub.add_parser(
        "run", formatter_class=_HelpFormatter, help="submit every row, wait, download, summarise",
        description="Submit every row of MANIFEST, wait for its job, download its archived "
                    "outputs, summarise.\n"
                    "MANIFEST is JSONL (one {\"route\", \"identity\", \"body\"} object a "
                    "line) or CSV (a header\nline of dotted column names: route,identity.sku,"
                    "body.prompt,body.n:int), by its\nextension (.csv) or --format. A run "
                    "killed at any moment resumes from its state file\nwhen started again, "
                    "and says so on stderr. IDEMGATE_TOKEN: the tenant token.")
    r.add_argument("manifest", help="the manifest file (JSONL or CSV)")
    r.add_argument("--format", choices=("auto", "jsonl", "csv"), default="auto",
                   help="manifest format; auto: CSV when the name ends in .csv, else JSONL "
                        "(default: %(default)s)")
    r.add_argument("--url", default=os.environ.get("IDEMGATE_URL", "http://127.0.0.1:8080"),
                   help="the gateway (default: $IDEMGATE_URL, else http://127.0.0.1:8080; "
                        "now %(default)s)")
    r.add_argument("--route", metavar="PROVIDER/ROUTE",
                   help="provider/route for rows without a \"route\" (default: none: every "
                        "row names its route)")
    r.add_argument("--key-fields", metavar="FIELDS",
                   help="comma-separated row members (dotted: body.prompt) that form the "
                        "identity of rows without an \"identity\" (default: none: every row "
                        "has an identity)")
    r.add_argument("--key-prefix", metavar="PREFIX", default="",
                   help="readable prefix of every key, part of the key: a resumed run must "
                        "give the same (default: none)")
    r.add_argument("--state", metavar="FILE",
                   help="SQLite state file (default: MANIFEST.state.sqlite)")
    r.add_argument("--results", metavar="FILE",
                   help="results JSONL (default: MANIFEST.results.jsonl)")
    r.add_argument("--out", metavar="DIR",
                   help="folder for downloaded outputs (default: MANIFEST.outputs/)")
    r.add_argument("--no-download", action="store_true",
                   help="do not download outputs (default: download them)")
    r.add_argument("--concurrency", type=int, metavar="N", default=2,
                   help="rows in flight (default: %(default)s)")
    r.add_argument("--wait", type=int, metavar="N", default=20,
                   help="Prefer: wait=N seconds on each submit (default: %(default)s)")
    r.add_argument("--row-timeout", type=float, metavar="SECONDS", default=600,
                   help="seconds to wait for one job before leaving it for the next run "
                        "(default: %(default)g)")
    r.add_argument("--archive-timeout", type=float, metavar="SECONDS", default=120,
                   help="seconds to wait for a completed job's outputs to be archived "
                        "(default: %(default)g)")
    r.add_argument("--retries", type=int, metavar="N", default=6,
                   help="attempts per request, with the same key (default: %(default)s)")
    ap.epilog = "The options of `idemgate-batch run`:\n\n" + r.format_help()
    return ap


def main(argv=None):
    a = parser().parse_args(argv)

    token = os.environ.get("IDEMGATE_TOKEN")
    if not token:
        print("idemgate-batch: IDEMGATE_TOKEN is not set (the token is never read from the "
              "command line)", file=sys.stderr)
        return EXIT_USAGE
    fields = [f.strip() for f in a.key_fields.split(",") if f.strip()] if a.key_fields else None
    try:
        rows = read_manifest(a.manifest, a.route, fields, a.key_prefix, a.format)
    except (ManifestError, OSError) as e:
        print(f"idemgate-batch: {e}", file=sys.stderr)
        return EXIT_USAGE
    state = State(a.state or a.manifest + ".state.sqlite")
    held = state.count()
    if held and not state.known(rows):
        # Every key differs from the earlier run's: a changed --key-prefix or --key-fields, or
        # edited identities. Run on, every row (the finished ones too) would be a new paid job.
        print(f"idemgate-batch: {state.path} holds {held} rows of an earlier run and none of "
              "this manifest's keys: --key-prefix, --key-fields or the rows' identities differ "
              "from that run's (each row would be a new paid job). Give the earlier run's "
              "settings, or a new --state for a new batch.", file=sys.stderr)
        return EXIT_USAGE
    client = Client(a.url, token, retry=policy.RetryPolicy(max_attempts=max(1, a.retries)),
                    log=lambda m: print(f"idemgate-batch: {m}", file=sys.stderr, flush=True))
    runner = Runner(client, state, rows, a.out or a.manifest + ".outputs",
                    concurrency=a.concurrency, wait=a.wait, row_timeout=a.row_timeout,
                    download=not a.no_download, archive_timeout=a.archive_timeout)
    elapsed = runner.run()
    results_path = a.results or a.manifest + ".results.jsonl"
    final = runner.results(results_path)
    print(summary_table(final, runner.stop_reason, elapsed, runner.spend(), results_path))
    return exit_code(final, runner.stop.is_set())


if __name__ == "__main__":
    sys.exit(main())
