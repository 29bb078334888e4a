// The client's rules without a gateway: keys, the retry policy, and what the client does with
// each kind of answer, against a local HTTP server that plays scripted answers and records
// every request it received (so "the same key" and "not retried" are counted, not assumed).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createServer } from "node:http";
import { once } from "node:events";
import { test } from "node:test";

import {
  BudgetExceeded, Client, InvalidRequest, JOB_STATES, JobHandle, KeyReused, NotFound,
  OutputsUnavailable, RateLimited, RetryPolicy, TERMINAL_STATES, Unauthorized, Unavailable,
  canonicalJson, classify, deriveKey, parseRetryAfter, pollDelay,
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

/** A server answering each request with the next scripted answer ("reset" destroys the socket). */
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
      res.writeHead(a.status, { "content-type": "application/json", ...a.headers });
      res.end(typeof a.body === "string" ? a.body : JSON.stringify(a.body));
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
