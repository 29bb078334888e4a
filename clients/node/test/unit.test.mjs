// The client's rules without a gateway: keys, the retry policy, outputs()'s decisions, and what
// the client does with each kind of answer, against a local HTTP server that plays scripted answers and records
// every request it received (so "the same key" and "not retried" are counted, not assumed).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createServer } from "node:http";
import { once } from "node:events";
import { test } from "node:test";

import { createHash } from "node:crypto";
import { mkdtemp, readFile, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

import {
  BudgetExceeded, Client, IntegrityError, InvalidRequest, JOB_STATES, JobHandle, KeyReused, NotFound,
  OUTPUTS_TIMEOUT_SECONDS, OutputsUnavailable, RateLimited, RetryPolicy, TERMINAL_STATES, Unauthorized,
  Unavailable, archiveSettled, canonicalJson, classify, deriveKey, digestMismatch, etagDigest,
  extensionFor, maxOutputsPolls, outputFileName, outputsStep, parseRetryAfter, pollDelay,
} from "../dist/index.js";

const DIST = new URL("../dist/index.js", import.meta.url).href;

// --- keys -----------------------------------------------------------------------------------

const POSTER = { product: "sku-123", template_version: 3, prompt_version: 2, language: "de",
                 aspect_ratio: "16:9", variant: 1 };
// Computed once and checked against the Python client's derive_key (clients/python): a change
// of canonical form would silently split every caller's keys, so it must fail here.
const POSTER_KEY = "poster-06496f04cd45b75cc9a1e8dade1dc02ea80d0a7f64c49e28877c6c3bfeac92cf";
const ODD = { "é": 1, a: [true, null, "x\n\u0001"], "\u{1F600}": "\u{1F600}", "\uffff": 0 };
const ODD_CANON = '{"a":[true,null,"x\\n\\u0001"],"é":1,"\u{1F600}":"\u{1F600}","\uffff":0}';
const ODD_KEY = "07e2aba825a21b26e1d0423b5da82c164b89817acb02322dbb0546ab5cc5a8d5";

test("a key is the SHA-256 of the identity's canonical JSON, as in the Python client", () => {
  assert.equal(deriveKey(POSTER, { prefix: "poster-" }), POSTER_KEY);
  assert.equal(canonicalJson(ODD), ODD_CANON); // members by UTF-16 code units: U+1F600 < U+FFFF
  assert.equal(deriveKey(ODD), ODD_KEY);
});

test("a key is the same in another process and whatever the member order", () => {
  const reversed = Object.fromEntries(Object.entries(POSTER).reverse());
  assert.equal(deriveKey(reversed, { prefix: "poster-" }), POSTER_KEY);
  const script = `import(${JSON.stringify(DIST)}).then((m) => process.stdout.write(` +
    `m.deriveKey(${JSON.stringify(POSTER)}, { prefix: "poster-" })))`;
  assert.equal(execFileSync(process.execPath, ["-e", script], { encoding: "utf8", timeout: 30000 }), POSTER_KEY);
});

test("fields pick the identity; a missing field, an empty identity or a float is refused", () => {
  const withNoise = { ...POSTER, trace_id: "t-1", requested_at: "2026-12-01T14:00:00Z" };
  assert.equal(deriveKey(withNoise, { fields: Object.keys(POSTER), prefix: "poster-" }), POSTER_KEY);
  assert.throws(() => deriveKey(POSTER, { fields: ["product", "size"] }), /lacks size/);
  assert.throws(() => deriveKey({}), /empty identity/);
  assert.throws(() => deriveKey({ ratio: 1.5 }), /non-integer/);
  assert.throws(() => deriveKey({ n: 2 ** 60 }), /beyond 2\^53/);
  assert.throws(() => deriveKey({ at: new Date(0) }), /Date is not part/);
  assert.throws(() => deriveKey({ s: "\ud800" }), /lone surrogate/);
  assert.throws(() => deriveKey({ a: 1 }, { prefix: "bad prefix" }), /prefix/);
  assert.notEqual(deriveKey({ ...POSTER, variant: 2 }), deriveKey({ ...POSTER, variant: 1 }));
});

// --- policy ---------------------------------------------------------------------------------

test("what an answer is", () => {
  assert.equal(classify(202, false), "job");
  assert.equal(classify(200, false), "job");
  assert.equal(classify(503, true), "job_answer"); // the provider's stored 503: the job's result
  assert.equal(classify(400, true), "job_answer");
  for (const s of [408, 429, 500, 502, 503, 504]) assert.equal(classify(s, false), "retry", String(s));
  for (const s of [400, 401, 402, 403, 404, 409, 413, 422]) assert.equal(classify(s, false), "fail", String(s));
});

test("Retry-After in seconds or as a date; anything else is no hint", () => {
  const now = Date.parse("Tue, 01 Dec 2026 14:00:00 GMT");
  assert.equal(parseRetryAfter("3", now), 3);
  assert.equal(parseRetryAfter(" 0 ", now), 0);
  assert.equal(parseRetryAfter("Tue, 01 Dec 2026 14:00:07 GMT", now), 7);
  assert.equal(parseRetryAfter("Tue, 01 Dec 2026 13:59:00 GMT", now), 0);
  for (const v of [null, undefined, "", "-1", "1.5", "soon", "2026-12-01T14:00:07Z"]) {
    assert.equal(parseRetryAfter(v, now), undefined, String(v));
  }
});

test("retries are bounded in attempts and time; a hint is a floor, capped", () => {
  const p = new RetryPolicy({ maxAttempts: 3, deadlineSeconds: 10, baseSeconds: 0.5, capSeconds: 4, hintCapSeconds: 6 });
  assert.equal(p.nextDelay(3, 0, undefined, 0.5), undefined);
  assert.equal(p.nextDelay(1, 0, 2, 0), 2);
  assert.equal(p.nextDelay(1, 0, 60, 0), 6);
  assert.equal(p.nextDelay(2, 9, 2, 0), undefined); // would start after the deadline
  assert.ok(p.nextDelay(2, 0, undefined, 0.999) < 1);
  assert.throws(() => new RetryPolicy({ maxAttempts: 0 }), RangeError);
  assert.equal(pollDelay(0, "sending"), 0.25);
  assert.equal(pollDelay(30, "sending"), 5);
  assert.equal(pollDelay(30, "accepted"), 15);
});

// --- the client against scripted answers ----------------------------------------------------

const JOB = (over = {}) => ({
  id: "job_abc", object: "job", state: "prepared", terminal: false, provider: "p", route: "r",
  idempotency_key: "k", remote_id: null, parent_id: null, attempts: { transport: 0, generation: 1 },
  created_at: "2026-12-01T14:00:00Z", updated_at: "2026-12-01T14:00:00Z", first_sent_at: null,
  finished_at: null, expires_at: "2026-12-08T14:00:00Z", result: null, usage: null,
  provider_status: null, profile: null, polls: 0, last_error: null, links: { self: "/v1/jobs/job_abc" },
  ...over,
});
const PROBLEM = (status, name, extra = {}) => ({
  status, headers: { "content-type": "application/problem+json", ...extra },
  body: { type: `urn:idemgate:problem:${name}`, title: name, status, detail: `${name} detail`, request_id: "r1" },
});
const OK = (job = JOB(), status = 202, headers = {}) => ({ status, headers, body: job });

/** A server answering each request with the next scripted answer ("reset" destroys the socket;
 *  an answer with `truncate` ends the connection after half its body). */
async function scripted(t, answers) {
  const seen = [];
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      seen.push({ method: req.method, url: req.url, headers: req.headers, body: Buffer.concat(chunks).toString() });
      const a = answers[seen.length - 1] ?? PROBLEM(500, "internal");
      if (a === "reset") {
        req.socket.destroy();
        return;
      }
      if (a.truncate) { // the full Content-Length, half the body, then the connection ends
        res.writeHead(a.status, { ...a.headers, "content-length": String(a.body.length) });
        res.write(a.body.subarray(0, a.body.length >> 1), () => req.socket.destroy());
        return;
      }
      res.writeHead(a.status, { "content-type": "application/json", ...a.headers });
      res.end(typeof a.body === "string" || Buffer.isBuffer(a.body) ? a.body : JSON.stringify(a.body));
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  t.after(() => new Promise((r) => server.close(r)));
  return { url: `http://127.0.0.1:${server.address().port}`, seen };
}

function client(url, extra = {}) {
  const slept = [];
  const retries = [];
  const c = new Client({ baseUrl: url, token: "tok", random: () => 0.5,
                         sleep: async (s) => { slept.push(s); },
                         onRetry: (e) => retries.push(e), ...extra });
  return { c, slept, retries };
}

const ROUTE = "p/images/generations";

test("a 503 then a job: the retry resends the same key and the same body", async (t) => {
  const s = await scripted(t, [PROBLEM(503, "store-busy", { "retry-after": "1" }), OK()]);
  const { c, slept } = client(s.url);
  const h = await c.submit(ROUTE, { prompt: "x", n: 1 }, "key-1");
  assert.equal(h.id, "job_abc");
  assert.equal(s.seen.length, 2);
  assert.deepEqual(s.seen.map((r) => r.headers["idempotency-key"]), ["key-1", "key-1"]);
  assert.equal(s.seen[0].body, s.seen[1].body);
  assert.equal(s.seen[0].headers.authorization, "Bearer tok");
  assert.equal(s.seen[0].url, "/v1/providers/p/images/generations");
  assert.deepEqual(slept, [1]); // the hint (1 s) over the jitter (0.25 s)
});

test("a reset connection is retried with the same key", async (t) => {
  const s = await scripted(t, ["reset", OK(JOB(), 200, { "idempotent-replayed": "true" })]);
  const { c, retries } = client(s.url);
  const h = await c.submit(ROUTE, { prompt: "x" }, "key-2");
  assert.equal(h.replayed, true);
  assert.deepEqual(s.seen.map((r) => r.headers["idempotency-key"]), ["key-2", "key-2"]);
  assert.equal(retries.length, 1);
  assert.equal(retries[0].status, undefined);
  assert.ok(retries[0].error);
});

for (const [status, name, Err] of [[422, "idempotency-key-reused", KeyReused], [400, "invalid-json", InvalidRequest],
                                  [401, "unauthorized", Unauthorized], [402, "budget-exceeded", BudgetExceeded],
                                  [404, "unknown-route", NotFound]]) {
  test(`a ${status} ${name} is thrown at once, never retried`, async (t) => {
    const s = await scripted(t, [PROBLEM(status, name), OK()]);
    const { c, retries } = client(s.url);
    const err = await c.submit(ROUTE, { prompt: "x" }, "key-3").then(() => null, (e) => e);
    assert.ok(err instanceof Err, String(err));
    assert.equal(err.status, status);
    assert.equal(err.type, name);
    assert.equal(err.key, "key-3");
    assert.equal(err.requestId, "r1");
    assert.equal(s.seen.length, 1);
    assert.equal(retries.length, 0);
  });
}

test("a 429 is retried after its Retry-After, then RateLimited when the attempts are spent", async (t) => {
  const limited = PROBLEM(429, "rate-limited", { "retry-after": "2" });
  const s = await scripted(t, [limited, limited, limited, OK()]);
  const { c, slept } = client(s.url, { retry: { maxAttempts: 3 } });
  const err = await c.submit(ROUTE, { prompt: "x" }, "key-4").then(() => null, (e) => e);
  assert.ok(err instanceof RateLimited, String(err));
  assert.equal(err.retryAfter, 2);
  assert.match(err.message, /after the retries with the same key/);
  assert.equal(s.seen.length, 3);
  assert.deepEqual(slept, [2, 2]);
  assert.deepEqual(new Set(s.seen.map((r) => r.headers["idempotency-key"])), new Set(["key-4"]));
});

test("an unreachable gateway is Unavailable after the bounded attempts, same key each time", async () => {
  const server = createServer().listen(0, "127.0.0.1");
  await once(server, "listening");
  const port = server.address().port;
  await new Promise((r) => server.close(r)); // nothing listens there now: connections are refused
  const { c, retries } = client(`http://127.0.0.1:${port}`, { retry: { maxAttempts: 4 } });
  const err = await c.submit(ROUTE, { prompt: "x" }, "key-7").then(() => null, (e) => e);
  assert.ok(err instanceof Unavailable, String(err));
  assert.equal(err.key, "key-7");
  assert.match(err.message, /ECONNREFUSED/);
  assert.equal(retries.length, 3);
  assert.ok(retries.every((r) => r.key === "key-7" && r.status === undefined && r.error));
});

test("a provider's stored error after Prefer: wait is the job's answer, not retried", async (t) => {
  const done = JOB({ state: "failed", terminal: true, result: { status: 503, body: { error: "overloaded" } } });
  const s = await scripted(t, [
    { status: 503, headers: { "x-idemgate-job-id": "job_abc", "x-idemgate-state": "failed" }, body: { error: "overloaded" } },
    OK(done, 200),
  ]);
  const { c, retries } = client(s.url);
  const h = await c.submit(ROUTE, { prompt: "x" }, "key-5", { wait: 5 });
  assert.equal(retries.length, 0);
  assert.equal(h.answer.status, 503);
  assert.deepEqual(h.answer.json(), { error: "overloaded" });
  assert.equal(h.state, "failed");
  assert.equal(s.seen[0].headers.prefer, "wait=5");
  assert.equal(s.seen[1].url, "/v1/jobs/job_abc");
});

test("completed, failed and canceled are the terminal states; only completed is ok", () => {
  assert.deepEqual([...TERMINAL_STATES], ["completed", "failed", "canceled"]);
  for (const state of JOB_STATES) {
    const terminal = TERMINAL_STATES.includes(state);
    assert.equal(new JobHandle(JOB({ state, terminal })).terminal, terminal, state);
    // A state known to be terminal is, whatever the flag says.
    assert.equal(new JobHandle(JOB({ state, terminal: false })).terminal, terminal, state);
    assert.equal(new JobHandle(JOB({ state, terminal })).ok, state === "completed", state);
    assert.equal(new JobHandle(JOB({ state, terminal })).canceled, state === "canceled", state);
  }
});

test("a canceled job ends the wait at the first read: not thrown, not ok, its task and cost kept", async (t) => {
  const canceled = JOB({ state: "canceled", terminal: true, remote_id: "task_1", cancel_requested_at: "t",
                         cost: { currency: "USD", estimate_micros: 500, micros: 500 },
                         last_error: "canceled at the provider on our request: stopped" });
  const s = await scripted(t, [OK(canceled, 200)]);
  const { c, slept, retries } = client(s.url);
  const h = await c.wait("job_abc", { timeoutSeconds: 5 });
  assert.equal(h.state, "canceled");
  assert.ok(h.terminal && h.canceled && !h.ok);
  assert.equal(h.remoteId, "task_1");
  assert.equal(h.job.cost.micros, 500);
  assert.deepEqual(s.seen.map((r) => r.method), ["GET"]);
  assert.deepEqual(slept, []);
  assert.equal(retries.length, 0);
  const err = await c.outputs(h).then(() => null, (e) => e);
  assert.ok(err instanceof OutputsUnavailable && /canceled/.test(err.message), String(err));
});

test("without wait the gateway is asked not to hold the request", async (t) => {
  const s = await scripted(t, [OK()]);
  const { c } = client(s.url);
  await c.submit(ROUTE, '{"prompt":"as is"}', "key-6");
  assert.equal(s.seen[0].headers.prefer, "respond-async");
  assert.equal(s.seen[0].body, '{"prompt":"as is"}');
});

// --- outputs: the gateway's archived bytes ---------------------------------------------------

const REC = (index, state, over = {}) => ({
  index, state, kind: "url", attempts: state === "pending" ? 0 : 1, last_error: null, sha256: null, bytes: null,
  content_type: null, source_expires_at: null, archived_at: null, href: null, ...over,
});
const DONE = (archive, over = {}) => JOB({
  state: "completed", terminal: true,
  // The provider's expiring URLs: outputs() never hands them out nor fetches them.
  result: { status: 200, body: { data: [{ url: "http://provider.invalid/expiring/0.png" }] } },
  ...(archive === undefined ? {} : { archive }), ...over,
});
const T = { polls: 0, leftSeconds: 60, timeoutSeconds: 60 };

test("outputs: a job that did not complete has none; one not finished yet may (pending)", () => {
  for (const state of ["failed", "canceled"]) {
    const s = outputsStep(JOB({ state, terminal: true }), T);
    assert.deepEqual(s, { do: "throw", pending: false, message: `job job_abc is ${state}: only a completed job has outputs` });
  }
  for (const state of ["prepared", "sending", "accepted", "unknown", "review"]) {
    const s = outputsStep(JOB({ state }), T);
    assert.equal(s.do, "throw", state);
    assert.equal(s.pending, true, state);
    assert.match(s.message, /wait\(\) for it first/);
  }
  const none = outputsStep(DONE(undefined), T);
  assert.equal(none.do, "throw");
  assert.equal(none.pending, false);
  assert.match(none.message, /no output archival on this gateway/);
});

test("outputs: an output the gateway will not archive (failed, expired) is never, whatever the time left", () => {
  for (const state of ["failed", "expired"]) {
    const job = DONE([REC(0, "archived", { sha256: "a".repeat(64) }), REC(1, state, { last_error: "host not allowed" })]);
    for (const leftSeconds of [60, 0]) {
      assert.deepEqual(outputsStep(job, { ...T, leftSeconds }), {
        do: "throw", pending: false,
        message: `job job_abc: output 1 is ${state}: host not allowed (the gateway will not archive it)`,
      });
    }
  }
});

test("outputs: every output archived is downloaded, in index order", () => {
  const recs = [REC(1, "archived"), REC(0, "archived"), REC(2, "archived")];
  const s = outputsStep(DONE(recs), { ...T, leftSeconds: 0 });
  assert.equal(s.do, "download");
  assert.deepEqual(s.records.map((r) => r.index), [0, 1, 2]);
});

test("outputs: pending copies are read again with growing delays while there is time, then pending", () => {
  const job = DONE([REC(0, "archived"), REC(1, "pending", { last_error: "HTTP 503" })]);
  assert.deepEqual(outputsStep(job, T), { do: "read", afterSeconds: pollDelay(0, "completed") });
  assert.deepEqual(outputsStep(job, { ...T, polls: 3 }), { do: "read", afterSeconds: pollDelay(3, "completed") });
  assert.deepEqual(outputsStep(job, { ...T, polls: 20 }), { do: "read", afterSeconds: 5 });
  assert.deepEqual(outputsStep(job, { ...T, polls: 20, leftSeconds: 0.1 }), { do: "read", afterSeconds: 0.1 });
  for (const p of [{ ...T, leftSeconds: 0 }, { ...T, leftSeconds: -1 }, { ...T, polls: maxOutputsPolls(60) }]) {
    assert.deepEqual(outputsStep(job, p), {
      do: "throw", pending: true,
      message: "job job_abc: output 1 is still pending (last error: HTTP 503) after 60s; call outputs() again later",
    });
  }
  assert.equal(maxOutputsPolls(60), 242);
  assert.equal(maxOutputsPolls(0), 2);
});

test("outputs: an empty archive is asked about: planned without outputs is [], not planned yet is waited for", () => {
  const job = DONE([]);
  assert.deepEqual(outputsStep(job, T), { do: "probe" });
  assert.deepEqual(outputsStep(job, { ...T, leftSeconds: 0 }), { do: "probe" });
  assert.deepEqual(outputsStep(job, { ...T, probed: "output-not-found" }), { do: "download", records: [] });
  for (const probed of ["output-not-archived", ""]) {
    assert.deepEqual(outputsStep(job, { ...T, probed }), { do: "read", afterSeconds: 0.25 });
    assert.deepEqual(outputsStep(job, { ...T, probed, leftSeconds: 0 }), {
      do: "throw", pending: true,
      message: "job job_abc: its outputs are not planned for archiving yet after 60s; call outputs() again later",
    });
  }
});

test("outputs: a settled archive is not read again; an unsettled one is", () => {
  assert.equal(archiveSettled(DONE([REC(0, "archived"), REC(1, "failed")])), true);
  assert.equal(archiveSettled(DONE([REC(0, "archived"), REC(1, "pending")])), false);
  assert.equal(archiveSettled(DONE([])), false);
  assert.equal(archiveSettled(DONE(undefined)), false);
  assert.equal(archiveSettled(JOB({ state: "failed", terminal: true })), true);
  assert.equal(archiveSettled(JOB({ state: "accepted" })), false);
  assert.equal(OUTPUTS_TIMEOUT_SECONDS, 120);
});

test("outputs: a saved output's extension is its archived type's; names stay in their folder", () => {
  for (const [ct, ext] of [["image/png", ".png"], ["image/jpeg", ".jpg"], ["IMAGE/WEBP; q=1", ".webp"],
                           ["video/mp4", ".mp4"], ["audio/mpeg", ".mp3"], ["application/octet-stream", ".bin"],
                           ["application/x-unheard-of", ".bin"], ["", ".bin"], [null, ".bin"], [undefined, ".bin"]]) {
    assert.equal(extensionFor(ct), ext, String(ct));
  }
  assert.equal(outputFileName("job_abc", 1, "video/mp4"), "job_abc-1.mp4");
  assert.equal(outputFileName("../x/y", 0, null), ".._x_y-0.bin");
});

test("outputs: bytes are the archive's only when their SHA-256 is the ETag's and the record's", () => {
  const d = "ab".repeat(32);
  assert.equal(etagDigest(`"${d}"`), d);
  assert.equal(etagDigest(`W/"${d.toUpperCase()}"`), d);
  assert.equal(etagDigest(null), "");
  assert.equal(digestMismatch(d, `"${d}"`, d), undefined);
  assert.equal(digestMismatch(d, null, null), undefined);
  assert.equal(digestMismatch(d, `"${"0".repeat(64)}"`, d), "the ETag");
  assert.equal(digestMismatch(d, `"${d}"`, "0".repeat(64)), "the job's record");
});

const PNG = Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), Buffer.from("archived bytes")]);
const PNG_SHA = createHash("sha256").update(PNG).digest("hex");
const BYTES = (data, over = {}) => ({
  status: 200, body: data,
  headers: { "content-type": "image/png", etag: `"${createHash("sha256").update(data).digest("hex")}"`, ...over },
});
const ARCHIVED = (over = {}) => REC(0, "archived", { sha256: PNG_SHA, bytes: PNG.length, content_type: "image/png",
                                                  href: "/v1/jobs/job_abc/outputs/0", ...over });

test("outputs() right after wait: waits for the archive, then the archived bytes, never the provider's URL", async (t) => {
  const s = await scripted(t, [
    OK(DONE([]), 200),                                      // the job as wait() left it: not planned yet
    PROBLEM(404, "output-not-archived"),                    // the probe of output 0
    OK(DONE([REC(0, "pending")]), 200),
    OK(DONE([ARCHIVED()]), 200),
    BYTES(PNG),
  ]);
  const { c, slept } = client(s.url);
  const outs = await c.outputs(new JobHandle(DONE([])));
  assert.equal(outs.length, 1);
  assert.deepEqual(Buffer.from(outs[0].data), PNG);
  assert.deepEqual({ ...outs[0], data: undefined },
                   { index: 0, data: undefined, sha256: PNG_SHA, bytes: PNG.length, contentType: "image/png",
                     fileName: "job_abc-0.png" });
  assert.ok(!("url" in outs[0]));
  assert.deepEqual(s.seen.map((r) => `${r.method} ${r.url}`), [
    "GET /v1/jobs/job_abc", "GET /v1/jobs/job_abc/outputs/0", "GET /v1/jobs/job_abc", "GET /v1/jobs/job_abc",
    "GET /v1/jobs/job_abc/outputs/0",
  ]);
  assert.equal(s.seen[1].headers["if-none-match"], "*"); // the probe asks without the bytes
  assert.equal(s.seen[4].headers["if-none-match"], undefined);
  assert.deepEqual(slept, [pollDelay(0, "completed"), pollDelay(1, "completed")]);
});

test("outputs(): the wait is bounded; then OutputsUnavailable, pending, with the job id and its archive", async (t) => {
  const pending = DONE([ARCHIVED(), REC(1, "pending", { last_error: "HTTP 503 from the provider" })]);
  const s = await scripted(t, Array.from({ length: 40 }, () => OK(pending, 200)));
  const { c, slept } = client(s.url);
  // The sleep is replaced (next to no time passes): the bound on reads still ends the wait.
  const err = await c.outputs("job_abc", { timeoutSeconds: 5 }).then(() => null, (e) => e);
  assert.ok(err instanceof OutputsUnavailable, String(err));
  assert.equal(err.pending, true);
  assert.equal(err.jobId, "job_abc");
  assert.deepEqual(err.archive, pending.archive);
  assert.match(err.message, /output 1 is still pending \(last error: HTTP 503 from the provider\) after 5s/);
  assert.ok(s.seen.length >= 2 && s.seen.length <= maxOutputsPolls(5) + 1, String(s.seen.length));
  assert.ok(s.seen.every((r) => r.url === "/v1/jobs/job_abc"), "nothing downloaded while one is pending");
  assert.equal(slept.length, s.seen.length - 1);

  const now = await scripted(t, [OK(pending, 200)]);
  const e0 = await client(now.url).c.outputs("job_abc", { timeoutSeconds: 0 }).then(() => null, (e) => e);
  assert.ok(e0 instanceof OutputsUnavailable && e0.pending, String(e0));
  assert.equal(now.seen.length, 1, "timeoutSeconds 0: one read, no wait");
  await assert.rejects(client(now.url).c.outputs("job_abc", { timeoutSeconds: "60" }), TypeError);
});

test("outputs(): an output the gateway will not archive is OutputsUnavailable at once, not pending", async (t) => {
  const lost = DONE([ARCHIVED(), REC(1, "failed", { last_error: "refused: private address" })]);
  const s = await scripted(t, [OK(lost, 200)]);
  const { c, slept } = client(s.url);
  const err = await c.outputs(new JobHandle(lost)).then(() => null, (e) => e);
  assert.ok(err instanceof OutputsUnavailable, String(err));
  assert.equal(err.pending, false);
  assert.equal(err.jobId, "job_abc");
  assert.match(err.message, /output 1 is failed: refused: private address/);
  assert.equal(s.seen.length, 0, "a settled archive is decided without a read or a download");
  assert.deepEqual(slept, []);
});

test("outputs(): a job planned without outputs is [] (the probe says output-not-found)", async (t) => {
  const s = await scripted(t, [OK(DONE([]), 200), PROBLEM(404, "output-not-found")]);
  const { c } = client(s.url);
  assert.deepEqual(await c.outputs("job_abc"), []);
  assert.equal(s.seen.length, 2);
});

test("saveOutputs(): files named {job}-{n}{ext} from the archived type, a 503 retried, bytes checked", async (t) => {
  const other = Buffer.from("a second output, untyped");
  const recs = [ARCHIVED(), REC(1, "archived", { sha256: createHash("sha256").update(other).digest("hex"),
                                                 bytes: other.length, content_type: null })];
  const s = await scripted(t, [OK(DONE(recs), 200), PROBLEM(503, "store-busy", { "retry-after": "1" }), BYTES(PNG),
                               BYTES(other, { "content-type": "application/octet-stream" })]);
  const dir = await mkdtemp(join(tmpdir(), "idemgate-out-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const { c, slept } = client(s.url);
  const saved = await c.saveOutputs("job_abc", join(dir, "out"));
  assert.deepEqual(saved.map((o) => o.path), [join(dir, "out", "job_abc-0.png"), join(dir, "out", "job_abc-1.bin")]);
  assert.deepEqual(await readFile(saved[0].path), PNG);
  assert.deepEqual(await readFile(saved[1].path), other);
  assert.equal(saved[0].sha256, PNG_SHA);
  assert.deepEqual((await readdir(join(dir, "out"))).sort(), ["job_abc-0.png", "job_abc-1.bin"]);
  assert.deepEqual(slept, [1]);
});

test("saveOutputs(): bytes that are not the archived ones are an IntegrityError and leave no file", async (t) => {
  const forged = Buffer.from("not the archived bytes");
  for (const [name, answer] of [["the ETag", { ...BYTES(forged), headers: { "content-type": "image/png", etag: `"${PNG_SHA}"` } }],
                                ["the job's record", BYTES(forged)]]) {
    const s = await scripted(t, [OK(DONE([ARCHIVED()]), 200), answer]);
    const dir = await mkdtemp(join(tmpdir(), "idemgate-out-"));
    t.after(() => rm(dir, { recursive: true, force: true }));
    const err = await client(s.url).c.saveOutputs("job_abc", dir).then(() => null, (e) => e);
    assert.ok(err instanceof IntegrityError, String(err));
    assert.ok(err.message.includes(name), err.message);
    assert.deepEqual(await readdir(dir), []);
  }
});

test("outputs(): a body cut short is downloaded again, never returned half", async (t) => {
  const s = await scripted(t, [OK(DONE([ARCHIVED()]), 200), { ...BYTES(PNG), truncate: true }, BYTES(PNG)]);
  const { c, retries } = client(s.url);
  const outs = await c.outputs("job_abc");
  assert.deepEqual(Buffer.from(outs[0].data), PNG);
  assert.equal(s.seen.length, 3);
  assert.equal(retries.length, 1);
  assert.equal(retries[0].path, "/v1/jobs/job_abc/outputs/0");
  assert.ok(retries[0].error, "a transport error, not a status");
});

// --- streams --------------------------------------------------------------------------------

import { EventParser, JobEnded, StreamCut, StreamDiverged, streamEvents } from "../dist/index.js";

const WHOLE = 'data: {"n":1}\n\n: keep-alive\nevent: x\ndata: a\ndata: b\n\ndata: [DONE]\r\n\r\n';
const EVENTS = [{ event: undefined, data: '{"n":1}' }, { event: "x", data: "a\nb" }, { event: undefined, data: "[DONE]" }];
const enc = (s) => new TextEncoder().encode(s);

test("events are read from pieces cut anywhere, CRLF split across two included", () => {
  for (let cut = 0; cut <= WHOLE.length; cut++) {
    const p = new EventParser();
    const got = [...p.push(enc(WHOLE.slice(0, cut))), ...p.push(enc(WHOLE.slice(cut)))];
    assert.deepEqual(got, EVENTS, `cut at ${cut}`);
  }
  const p = new EventParser();
  assert.deepEqual(p.push(enc(WHOLE.slice(0, -2))), EVENTS.slice(0, 2)); // the last never dispatched
});

function opened(status, headers, pieces, breakAfter) {
  return {
    status, headers: new Headers(headers),
    body: (async function* () {
      for (let i = 0; i < pieces.length; i++) {
        if (breakAfter !== undefined && i === breakAfter) throw new TypeError("terminated");
        yield enc(pieces[i]);
      }
    })(),
    close: () => {},
  };
}

const SSE = { "content-type": "text/event-stream", "x-idemgate-job-id": "job_1" };
const PIECES = [WHOLE.slice(0, 10), WHOLE.slice(10, 40), WHOLE.slice(40)];

test("a cut connection is opened again with the same key and each event is given once", async () => {
  const answers = [opened(200, SSE, PIECES, 2), opened(200, SSE, PIECES)];
  let opens = 0;
  const got = [];
  for await (const ev of streamEvents(async () => answers[opens++], "k1", 6, async () => {})) got.push(ev);
  assert.equal(opens, 2);
  assert.deepEqual(got, EVENTS);
});

test("a record that is not the stream given raises StreamDiverged, never skipped into", async () => {
  // An error event before any output, then a later attempt that generated: the replay's first
  // events are not those given. Reading again from the start gives the record whole.
  const refused = 'event: message_start\ndata: {"id":"msg_1"}\n\nevent: error\ndata: {"type":"overloaded_error"}\n\n';
  const other = 'event: message_start\ndata: {"id":"msg_2"}\n\n' + WHOLE;
  const answers = [opened(200, SSE, [refused, "x"], 1), opened(200, SSE, [other])];
  let opens = 0;
  const got = [];
  await assert.rejects(async () => {
    for await (const ev of streamEvents(async () => answers[opens++], "k1", 6, async () => {})) got.push(ev);
  }, (e) => e instanceof StreamDiverged && e.jobId === "job_1");
  assert.deepEqual(got.map((e) => e.event), ["message_start", "error"]);
  const again = [];
  for await (const ev of streamEvents(async () => opened(200, SSE, [other]), "k1", 6, async () => {})) again.push(ev);
  assert.deepEqual(again[0], { event: "message_start", data: '{"id":"msg_2"}' });
  assert.equal(again.length, 1 + EVENTS.length);
});

test("a job's stored end is final and names the job (never an outage to retry)", async () => {
  // Before, a 502 job-failed or a provider's stored 503 read as Unavailable ("send it again
  // later") and a 429 as RateLimited, the job's id lost.
  for (const [status, state] of [[502, "failed"], [429, "failed"], [503, "failed"], [409, "canceled"]]) {
    let opens = 0;
    await assert.rejects(async () => {
      const open = async () => {
        opens++;
        return opened(status, { "content-type": "application/json", "x-idemgate-job-id": "job_1",
                                "x-idemgate-state": state }, ['{"error":"no"}']);
      };
      for await (const ev of streamEvents(open, "k1", 6, async () => {})) void ev;
    }, (e) => e instanceof JobEnded && e.jobId === "job_1" && e.state === state &&
              e.status === status && e.body === '{"error":"no"}');
    assert.equal(opens, 1, `${status}: opened once`);
  }
});

test("no whole stream anywhere is a StreamCut naming the job", async () => {
  const answers = [opened(200, SSE, PIECES, 2),
                   opened(202, { "content-type": "application/json", "x-idemgate-job-id": "job_1" },
                          ['{"id":"job_1","state":"unknown"}'])];
  let opens = 0;
  const got = [];
  await assert.rejects(async () => {
    for await (const ev of streamEvents(async () => answers[opens++], "k1", 6, async () => {})) got.push(ev);
  }, (e) => e instanceof StreamCut && e.jobId === "job_1");
  assert.deepEqual(got, EVENTS.slice(0, 1));
});

import { RetryPolicy as StreamRetry, Unknown as StreamUnknown, RateLimited as StreamRateLimited,
         Unavailable as StreamUnavailable, streamAnswerKind } from "../dist/index.js";

const JOBDOC = { "content-type": "application/json", "x-idemgate-job-id": "job_1" };

test("what a stream's open answered without events means (streamAnswerKind)", () => {
  const rows = [
    [202, JOBDOC, '{"id":"job_1","state":"sending"}', false, "pending", "sending"],
    [202, JOBDOC, '{"id":"job_1","state":"prepared"}', false, "pending", "prepared"],
    [202, JOBDOC, '{"id":"job_1","state":"accepted"}', false, "pending", "accepted"],
    [202, JOBDOC, '{"id":"job_1","state":"unknown"}', false, "cut", "unknown"],
    [202, JOBDOC, '{"id":"job_1","state":"review"}', false, "cut", "review"],
    [200, { "content-type": "application/json" }, '{"id":"job_1","state":"completed","terminal":true}',
     false, "ended", "completed"],
    [202, JOBDOC, "not json", false, "cut", undefined],
    [200, { "content-type": "application/json" }, "{}", true, "cut", undefined],
    [503, { ...JOBDOC, "x-idemgate-state": "failed" }, "{}", false, "ended", "failed"],
    [503, { "content-type": "application/problem+json" }, "{}", false, "retry", undefined],
    [429, { "content-type": "application/problem+json" }, "{}", true, "retry", undefined],
    [422, { "content-type": "application/problem+json" }, "{}", false, "fail", undefined],
  ];
  for (const [status, headers, text, hadJob, kind, state] of rows) {
    assert.deepEqual(streamAnswerKind(status, new Headers(headers), text, hadJob), { kind, state },
                     `${status} ${text}`);
  }
});

test("a wait that ran out before the first output opens the stream again with the same key", async () => {
  // Before, a StreamCut ("paid and in doubt"): a caller asking again under a new key paid twice.
  const answers = [opened(202, JOBDOC, ['{"id":"job_1","state":"sending"}']), opened(200, SSE, PIECES)];
  let opens = 0;
  const got = [];
  for await (const ev of streamEvents(async () => answers[opens++], "k1", 6, async () => {})) got.push(ev);
  assert.equal(opens, 2);
  assert.deepEqual(got, EVENTS);
});

test("a job still on its way after every wait is Unknown, naming the job", async () => {
  let opens = 0;
  const open = async () => { opens++; return opened(202, JOBDOC, ['{"id":"job_1","state":"accepted"}']); };
  await assert.rejects(async () => {
    for await (const ev of streamEvents(open, "k1", 3, async () => {})) void ev;
  }, (e) => e instanceof StreamUnknown && e.jobId === "job_1" && e.state === "accepted");
  assert.equal(opens, 3);
});

test("a stream is opened maxAttempts times in all, whatever ends each opening", async () => {
  // maxAttempts is the attempts in all, the first included (RetryPolicy's meaning), as the
  // Python client's stream() now does too: it opened a cut or unreachable stream one more time.
  const ends = [
    ["cut", () => opened(200, SSE, PIECES, 1), StreamUnavailable],
    ["waited out", () => opened(202, JOBDOC, ['{"id":"job_1","state":"sending"}']),
     StreamUnknown],
    ["refused", () => opened(503, { "content-type": "application/problem+json" },
                             ['{"type":"urn:idemgate:problem:store-unavailable"}']),
     StreamUnavailable],
    ["unreachable", () => { throw new TypeError("fetch failed"); }, StreamUnavailable],
  ];
  for (const [what, answer, thrown] of ends) {
    let opens = 0;
    const open = async () => { opens++; return answer(); };
    await assert.rejects(async () => {
      const retry = new StreamRetry({ maxAttempts: 3 });
      for await (const ev of streamEvents(open, "k1", retry, async () => {}, () => 0)) void ev;
    }, (e) => e instanceof thrown, what);
    assert.equal(opens, 3, what);
  }
});

test("a passing refusal opens the stream again with the same key after its Retry-After", async () => {
  // 503 store-unavailable may follow a commit whose answer was lost; before, thrown at once.
  const answers = [
    opened(503, { "content-type": "application/problem+json", "retry-after": "2" },
           ['{"type":"urn:idemgate:problem:store-unavailable"}']),
    opened(429, { "content-type": "application/problem+json", "retry-after": "1" },
           ['{"type":"urn:idemgate:problem:rate-limited"}']),
    opened(200, SSE, PIECES)];
  let opens = 0;
  const slept = [];
  const got = [];
  for await (const ev of streamEvents(async () => answers[opens++], "k1", new StreamRetry(),
                                      async (s) => { slept.push(s); }, () => 0)) got.push(ev);
  assert.deepEqual(got, EVENTS);
  assert.deepEqual(slept, [2, 1]);
  let n = 0;
  const limited = async () => {
    n++;
    return opened(429, { "content-type": "application/problem+json" },
                  ['{"type":"urn:idemgate:problem:rate-limited"}']);
  };
  await assert.rejects(async () => {
    for await (const ev of streamEvents(limited, "k1", new StreamRetry({ maxAttempts: 4 }), async () => {},
                                        () => 0)) void ev;
  }, (e) => e instanceof StreamRateLimited && /same key/.test(e.message));
  assert.equal(n, 4);
});

test("a stream whose events keep coming is not cut by a deadline for the whole of it", async (t) => {
  // The open's timeout is an idle one, armed again by every piece. Before, it was set once for
  // the whole stream (timeoutSeconds + wait): a stream longer than that was cut however fast
  // its events came, and read again from its start (opened twice here).
  let opens = 0;
  const server = createServer((req, res) => {
    opens++;
    req.resume();
    req.on("end", async () => {
      res.writeHead(200, { "content-type": "text/event-stream", "x-idemgate-job-id": "job_1" });
      for (let i = 0; i < 8; i++) {
        res.write(`data: ${i}\n\n`);
        await new Promise((r) => setTimeout(r, 250));
      }
      res.end("data: [DONE]\n\n");
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  t.after(() => new Promise((r) => server.close(r)));
  // An idle allowance of 1.2 s (0.2 + a wait of 1) for a stream of 2 s whose pieces come every 0.25 s.
  const c = new Client({ baseUrl: `http://127.0.0.1:${server.address().port}`, token: "t",
                         timeoutSeconds: 0.2, maxWaitSeconds: 1 });
  const got = [];
  for await (const ev of c.stream("p/chat/completions", { model: "m" }, "k1", { wait: 1 })) got.push(ev.data);
  assert.deepEqual(got, ["0", "1", "2", "3", "4", "5", "6", "7", "[DONE]"]);
  assert.equal(opens, 1);
});

test("a wait whose held request is refused in passing each time reads the job by id, never throws", async (t) => {
  // submit() → 202; wait() holds the same request again (Prefer: wait), refused 429 on every
  // attempt (too many waits on the replica): the job exists, so it is read by id. Before,
  // RateLimited came out of wait() ("nothing was recorded") for a job that was paid.
  const retry = new RetryPolicy({ maxAttempts: 2 });
  const s = await scripted(t, [OK(), PROBLEM(429, "rate-limited"), PROBLEM(429, "rate-limited"),
                               OK(JOB({ state: "completed", terminal: true }), 200)]);
  const { c } = client(s.url, { retry });
  const submitted = await c.submit(ROUTE, { prompt: "x" }, "key-w");
  const h = await c.wait(submitted, { timeoutSeconds: 30 });
  assert.equal(h.state, "completed");
  assert.deepEqual(s.seen.map((r) => `${r.method} ${r.url}`),
                   [`POST /v1/providers/${ROUTE}`, `POST /v1/providers/${ROUTE}`,
                    `POST /v1/providers/${ROUTE}`, "GET /v1/jobs/job_abc"]);
});
