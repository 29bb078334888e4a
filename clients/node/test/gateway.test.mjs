// The client against the real gateway and the counting mock provider, started by
// tests/integration/test_node_client.py, which passes in the environment:
//   IDEMGATE_URL, IDEMGATE_TOKEN        the gateway and a tenant's token
//   IDEMGATE_LIMITED_TOKEN              a tenant limited to 1 request/s, burst 1
//   IDEMGATE_MOCK_URL                   the mock (GET /_ledger counts creates by client_ref = job id)
//   DATABASE_URL                        the gateway's database (read with psql; a lock provokes 503)
//   IDEMGATE_SYNC_ROUTE, IDEMGATE_ASYNC_ROUTE  a sync route and an async (Replicate-shaped) one
// Without IDEMGATE_URL every test here is skipped (the wrapper fails on a skip).
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { createHash, randomUUID } from "node:crypto";
import { once } from "node:events";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { Client, KeyReused, RateLimited, Unauthorized, Unknown, deriveKey } from "../dist/index.js";

const env = process.env;
const skip = env.IDEMGATE_URL ? false : "IDEMGATE_URL is not set (run by tests/integration/test_node_client.py)";
const SYNC = env.IDEMGATE_SYNC_ROUTE ?? "mock-images/images/generations";
const ASYNC = env.IDEMGATE_ASYNC_ROUTE ?? "replicate/flux-schnell";

const run = randomUUID(); // this run's identities are its own; keys are still derived, never random
const identity = (name, extra = {}) => ({ test: name, run, ...extra });
const client = (extra = {}) => new Client({ baseUrl: env.IDEMGATE_URL, token: env.IDEMGATE_TOKEN, ...extra });

function psql(sql) {
  const out = execFileSync("psql", [env.DATABASE_URL, "-qtAX", "-F", "\t", "-c", sql], { encoding: "utf8", timeout: 30000 });
  return out.split("\n").filter((l) => l !== "").map((l) => l.split("\t"));
}
const quote = (s) => `'${s.replaceAll("'", "''")}'`;

async function creates(jobId) {
  const r = await fetch(`${env.IDEMGATE_MOCK_URL}/_ledger`);
  assert.equal(r.status, 200);
  return (await r.json()).creates.filter((c) => c.client_ref === jobId && !c.replay);
}

test("submit with wait returns the provider's own body; outputs are the archive's copies of its images", { skip }, async () => {
  const c = client();
  const key = deriveKey(identity("body"), { prefix: "node-" });
  const h = await c.submit(SYNC, { prompt: "a lighthouse at dawn", n: 2 }, key, { wait: 20 });
  assert.equal(h.state, "completed");
  assert.ok(h.ok && h.terminal);
  assert.equal(h.key, key);
  assert.equal(h.replayed, false);
  assert.equal(h.answer.status, 200);
  const body = h.answer.json();
  assert.equal(body.data.length, 2);
  assert.deepEqual(h.job.result.body, body); // the stored body is the one we were given
  const outs = await c.outputs(h, { timeoutSeconds: 60 });
  const archive = (await c.get(h)).job.archive;
  assert.deepEqual(outs.map((o) => o.index), [0, 1]);
  for (const o of outs) {
    assert.ok(!("url" in o), "no provider URL: the archived bytes");
    assert.equal(o.sha256, createHash("sha256").update(o.data).digest("hex"));
    assert.equal(o.sha256, archive[o.index].sha256);
    assert.equal(o.bytes, archive[o.index].bytes);
    assert.equal(o.contentType, "image/png");
    assert.equal(o.fileName, `${h.id}-${o.index}.png`);
  }
});

test("the same key twice is one job and one create at the provider", { skip }, async () => {
  const c = client();
  const key = deriveKey(identity("twice"), { prefix: "node-" });
  const body = { prompt: "twice", n: 1 };
  const first = await c.wait(await c.submit(SYNC, body, key), { timeoutSeconds: 30 });
  assert.equal(first.state, "completed");
  const again = await c.submit(SYNC, { n: 1, prompt: "twice" }, key, { wait: 10 }); // member order does not matter
  assert.equal(again.id, first.id);
  assert.equal(again.replayed, true);
  assert.deepEqual(again.answer.json(), first.job.result.body);
  assert.deepEqual(psql(`SELECT count(*) FROM operations WHERE idempotency_key = ${quote(key)}`), [["1"]]);
  assert.equal((await creates(first.id)).length, 1);
});

test("a 422 is KeyReused, thrown at once and never retried; the provider is not called again", { skip }, async () => {
  const retries = [];
  const c = client({ onRetry: (e) => retries.push(e) });
  const key = deriveKey(identity("reused"), { prefix: "node-" });
  const h = await c.wait(await c.submit(SYNC, { prompt: "the first body" }, key), { timeoutSeconds: 30 });
  const err = await c.submit(SYNC, { prompt: "an edited body" }, key).then(() => null, (e) => e);
  assert.ok(err instanceof KeyReused, String(err));
  assert.equal(err.status, 422);
  assert.equal(err.type, "idempotency-key-reused");
  assert.equal(err.key, key);
  assert.equal(retries.length, 0);
  assert.equal((await creates(h.id)).length, 1);
  assert.deepEqual(psql(`SELECT count(*) FROM operations WHERE idempotency_key = ${quote(key)}`), [["1"]]);
});

test("a 503 (the store busy) is retried after its Retry-After with the same key: one job, one create", { skip }, async (t) => {
  // Another session holds the operations table; the gateway's statements give up after
  // lock_timeout (200 ms, set by the wrapper) and answer 503 store-busy. The lock is released
  // when the client reports its first retry, so the retry is what succeeds.
  const holder = spawn("psql", [env.DATABASE_URL, "-qtAX", "-v", "ON_ERROR_STOP=1"], { stdio: ["pipe", "ignore", "inherit"] });
  const exited = once(holder, "exit");
  let released = false;
  const release = () => {
    if (!released) {
      released = true;
      holder.stdin.end("COMMIT;\n");
    }
  };
  t.after(async () => {
    release();
    await exited;
  });
  holder.stdin.write("BEGIN;\nLOCK TABLE operations IN ACCESS EXCLUSIVE MODE;\n");
  let locked = false;
  for (let i = 0; i < 400 && !locked; i++) { // bounded: 400 looks, 50 ms apart
    locked = psql("SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = 'operations' " +
                  "AND l.mode = 'AccessExclusiveLock' AND l.granted").length === 1;
    if (!locked) await sleep(50);
  }
  assert.ok(locked, "the lock was never taken");

  const retries = [];
  const c = client({ onRetry: (e) => { retries.push(e); release(); } });
  const key = deriveKey(identity("busy"), { prefix: "node-" });
  const h = await c.submit(SYNC, { prompt: "while the store is busy" }, key);
  assert.ok(retries.length >= 1, "no 503 was seen: the lock did not hold");
  assert.equal(retries[0].status, 503);
  assert.ok(retries[0].retryAfter >= 1, JSON.stringify(retries[0]));
  assert.ok(retries[0].delaySeconds >= retries[0].retryAfter, "the retry came before the hint");
  assert.ok(retries.every((r) => r.key === key));
  assert.equal(h.key, key);
  const done = await c.wait(h, { timeoutSeconds: 30 });
  assert.equal(done.state, "completed");
  assert.deepEqual(psql(`SELECT id FROM operations WHERE idempotency_key = ${quote(key)}`), [[h.id]]);
  assert.equal((await creates(h.id)).length, 1);
});

test("429: without retries it is RateLimited with Retry-After and nothing recorded", { skip }, async () => {
  const c = new Client({ baseUrl: env.IDEMGATE_URL, token: env.IDEMGATE_LIMITED_TOKEN, retry: { maxAttempts: 1 } });
  let err = null;
  let key;
  for (let i = 0; i < 20 && err === null; i++) { // 1 request/s, burst 1: the second one in a row is over
    key = deriveKey(identity("limited", { i }), { prefix: "node-" });
    err = await c.submit(SYNC, { prompt: `limited ${i}` }, key).then(() => null, (e) => e);
  }
  assert.ok(err instanceof RateLimited, String(err));
  assert.equal(err.status, 429);
  assert.equal(err.type, "rate-limited");
  assert.ok(err.retryAfter >= 1, String(err.retryAfter));
  assert.deepEqual(psql(`SELECT count(*) FROM operations WHERE idempotency_key = ${quote(key)}`), [["0"]]);
});

test("429: with retries the same request waits out Retry-After and is accepted, once", { skip }, async () => {
  const retries = [];
  const c = new Client({ baseUrl: env.IDEMGATE_URL, token: env.IDEMGATE_LIMITED_TOKEN,
                         onRetry: (e) => retries.push(e) });
  const jobs = [];
  for (let i = 0; i < 10 && !retries.some((r) => r.status === 429); i++) { // back to back: one is over the rate
    const key = deriveKey(identity("patient", { i }), { prefix: "node-" });
    jobs.push(await c.submit(SYNC, { prompt: `patient ${i}` }, key));
  }
  const limited = retries.filter((r) => r.status === 429);
  assert.ok(limited.length >= 1, JSON.stringify(retries));
  for (const r of limited) {
    assert.ok(r.retryAfter >= 1 && r.delaySeconds >= r.retryAfter, JSON.stringify(r));
  }
  const retriedKey = limited[0].key;
  const rows = psql(`SELECT count(*) FROM operations WHERE idempotency_key = ${quote(retriedKey)}`);
  assert.deepEqual(rows, [["1"]]);
  assert.ok(jobs.some((j) => j.key === retriedKey));
});

test("a wait that ends first throws Unknown carrying the job id", { skip }, async () => {
  const c = client();
  const key = deriveKey(identity("slow"), { prefix: "node-" });
  const h = await c.submit(SYNC, { prompt: "slow", _mock: { delay_ms: 4000 } }, key);
  const err = await c.wait(h, { timeoutSeconds: 1 }).then(() => null, (e) => e);
  assert.ok(err instanceof Unknown, String(err));
  assert.equal(err.jobId, h.id);
  assert.equal(err.key, key);
  assert.ok(["prepared", "sending"].includes(err.state), err.state);
  const done = await c.wait(err.jobId, { timeoutSeconds: 30 }); // waiting again by id finds it
  assert.equal(done.state, "completed");
  assert.equal((await creates(h.id)).length, 1);
});

test("an unknown token is Unauthorized, at once", { skip }, async () => {
  const retries = [];
  const c = new Client({ baseUrl: env.IDEMGATE_URL, token: "not-a-token", onRetry: (e) => retries.push(e) });
  const err = await c.submit(SYNC, { prompt: "x" }, "node-unauthorized").then(() => null, (e) => e);
  assert.ok(err instanceof Unauthorized, String(err));
  assert.equal(err.status, 401);
  assert.equal(retries.length, 0);
  assert.ok(!err.message.includes(env.IDEMGATE_TOKEN));
});

test("an async job: wait follows it to completed and outputs are its task's outputs, archived", { skip }, async () => {
  const c = client();
  const key = deriveKey(identity("async"), { prefix: "node-" });
  const h = await c.wait(await c.submit(ASYNC, { prompt: "a fox", _mock: { polls: 2, outputs: 2 } }, key),
                         { timeoutSeconds: 60 });
  assert.equal(h.state, "completed", JSON.stringify(h.job));
  assert.ok(h.job.remote_id);
  const outs = await c.outputs(h.id, { timeoutSeconds: 60 });
  const archive = (await c.get(h)).job.archive;
  assert.equal(outs.length, 2);
  assert.deepEqual(outs.map((o) => o.sha256), archive.map((r) => r.sha256));
  assert.ok(outs.every((o) => o.data.length > 0 && !("url" in o)));
  assert.equal((await creates(h.id)).length, 1);
});

test("cancel of an accepted async job: the provider's cancel once, then canceled (never failed) with its task; cancel again is the same", { skip }, async () => {
  const c = client();
  const key = deriveKey(identity("cancel"), { prefix: "node-" });
  let h = await c.submit(ASYNC, { prompt: "never mind", _mock: { polls: 100000 } }, key);
  for (let i = 0; i < 300 && h.state !== "accepted"; i++) { // bounded: 300 reads, 50 ms apart
    await sleep(50);
    h = await c.get(h);
  }
  assert.equal(h.state, "accepted");
  const asked = await c.cancel(h);
  assert.ok(asked.job.cancel_requested_at, JSON.stringify(asked.job));
  const done = await c.wait(h.id, { timeoutSeconds: 30 });
  // The task existed and the provider ended it on our request: canceled, terminal, not ok,
  // its remote id kept (issue 21 item 1).
  assert.equal(done.state, "canceled");
  assert.ok(done.terminal && done.canceled && !done.ok, JSON.stringify(done.job));
  assert.equal(done.remoteId, h.remoteId);
  assert.match(done.job.last_error, /cancel/);
  const again = await c.cancel(h.id);
  assert.equal(again.state, "canceled");
  const task = await (await fetch(`${env.IDEMGATE_MOCK_URL}/v1/predictions/${done.job.remote_id}`)).json();
  assert.equal(task.status, "canceled");
  assert.equal(task.cancels ?? 1, 1);
  assert.equal((await creates(h.id)).length, 1);
});

test("stream() gives the events as they arrive; a new consumer with the same key resumes from the record", { skip }, async () => {
  const c = client();
  const route = env.IDEMGATE_CHAT_ROUTE;
  const key = deriveKey(identity("stream"));
  const body = { model: "gpt-4o-mini", messages: [{ role: "user", content: "hi" }],
                 _mock: { events: 5, event_delay_ms: 100 } };
  const chatCreates = async () => {
    const r = await fetch(`${env.IDEMGATE_MOCK_URL}/_ledger`);
    return (await r.json()).creates.filter((e) => e.route === "/v1/chat/completions" && !e.replay).length;
  };
  const before = await chatCreates();
  const first = [];
  for await (const ev of c.stream(route, body, key, { wait: 30 })) {
    first.push(ev);
    if (first.length === 2) break; // the consumer goes away; the generation goes on, recorded
  }
  const again = [];
  for await (const ev of c.stream(route, body, key, { wait: 30 })) again.push(ev);
  assert.deepEqual(again.slice(0, 2), first);
  assert.equal(again.at(-1).data, "[DONE]");
  const text = again.filter((e) => e.data !== "[DONE]").map((e) => JSON.parse(e.data))
    .flatMap((c) => c.choices ?? []).map((ch) => ch.delta?.content ?? "").join("");
  assert.equal(text, "tok0 tok1 tok2 tok3 tok4 ");
  assert.equal(await chatCreates(), before + 1); // one create: the second consumer read the record
});
