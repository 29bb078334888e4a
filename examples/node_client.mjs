#!/usr/bin/env node
// Generate one product poster through idemgate — Node.js 20+, built-in fetch, no packages.
//
// The Idempotency-Key is derived from the identity of the output (see KEYS.md): running this
// twice, or from another process, machine or language with the same identity, yields the same
// job and at most one paid creation at the provider.
//
//   IDEMGATE_TOKEN=... node examples/node_client.mjs --product sku-123 \
//       --template-version 3 --prompt-version 2 --language de --aspect-ratio 16:9 --variant 1
//
// Options and exit status are those of python_client.py: 0 completed · 1 failed or canceled · 2 not
// retryable · 3 key reused with other parameters (422, never retried) · 4 gave up for now.
// stdout: one JSON line {"key", "job_id", "state", "replayed", "outputs"}; progress on stderr.

import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';

const EXIT = { ok: 0, failed: 1, client: 2, keyReused: 3, gaveUp: 4 };
const SIZES = { '1:1': '1024x1024', '16:9': '1792x1024', '9:16': '1024x1792' };

const log = (msg) => process.stderr.write(`node_client: ${msg}\n`);
const sha256 = (data) => createHash('sha256').update(data).digest('hex');

// The key names the output, so it is stable across retries, restarts and languages. Every
// input that changes the output is in it; nothing else is (no time, no random).
export function deriveKey(id) {
  const identity =
    `purpose=poster\nproduct_id=${id.product}\ntemplate_version=${id.templateVersion}\n` +
    `source_sha256=${id.sourceSha256}\nprompt_version=${id.promptVersion}\n` +
    `language=${id.language}\naspect_ratio=${id.aspectRatio}\nvariant=${id.variant}\n`;
  return `poster-${id.product}-` + sha256(identity).slice(0, 32);
}

function renderPrompt(id) {
  return `Studio poster for product ${id.product}, layout template v${id.templateVersion}, ` +
    `copy in ${id.language}, variant ${id.variant} (prompt v${id.promptVersion})`;
}

async function call(method, url, token, { body, headers = {}, timeoutMs = 30000 } = {}) {
  const h = { Authorization: `Bearer ${token}`, Accept: 'application/json', ...headers };
  if (body !== undefined) h['Content-Type'] = 'application/json';
  const res = await fetch(url, { method, headers: h, body, signal: AbortSignal.timeout(timeoutMs) });
  const text = await res.text();
  let json = {};
  try { json = JSON.parse(text); } catch { /* not JSON: keep {} */ }
  return { status: res.status, headers: res.headers, json };
}

const retryAfter = (r, dflt = 2) => {
  const v = r.headers.get('retry-after') ?? '';
  // At least what the gateway asked (the deadline bounds the wait).
  return /^\d+$/.test(v) ? Math.max(1, Math.min(Number(v), 300)) : dflt;
};
const problem = (r) =>
  `${r.status} ${(r.json.type ?? '').split(':').pop()}: ${r.json.detail ?? ''}`;
const outputsOf = (providerBody) =>
  (Array.isArray(providerBody?.data) ? providerBody.data : [])
    .filter((d) => d && typeof d.url === 'string').map((d) => d.url);

async function main() {
  const { values: a } = parseArgs({
    options: {
      url: { type: 'string', default: process.env.IDEMGATE_URL ?? 'http://127.0.0.1:8080' },
      route: { type: 'string', default: 'mock-images/images/generations' },
      product: { type: 'string' },
      'template-version': { type: 'string', default: '1' },
      source: { type: 'string' },
      'prompt-version': { type: 'string', default: '1' },
      language: { type: 'string', default: 'en' },
      'aspect-ratio': { type: 'string', default: '1:1' },
      variant: { type: 'string', default: '1' },
      'prompt-override': { type: 'string' },
      wait: { type: 'string', default: '10' },
      deadline: { type: 'string', default: '120' },
      'max-attempts': { type: 'string', default: '8' },
    },
  });
  const token = process.env.IDEMGATE_TOKEN;
  if (!token) { log('IDEMGATE_TOKEN is not set'); return EXIT.client; }
  const int = (name) => {
    if (!/^\d+$/.test(a[name])) throw new Error(`--${name} must be an integer`);
    return Number(a[name]);
  };
  let id;
  try {
    id = {
      product: a.product ?? '',
      templateVersion: int('template-version'),
      sourceSha256: a.source ? sha256(readFileSync(a.source)) : 'none',
      promptVersion: int('prompt-version'),
      language: a.language,
      aspectRatio: a['aspect-ratio'],
      variant: int('variant'),
    };
    if (!/^[A-Za-z0-9._-]{1,64}$/.test(id.product) || !/^[A-Za-z-]{2,16}$/.test(id.language) ||
        !(id.aspectRatio in SIZES)) {
      throw new Error('--product [A-Za-z0-9._-]{1,64}, --language a tag, --aspect-ratio 1:1|16:9|9:16');
    }
  } catch (e) { log(e.message); return EXIT.client; }

  const key = deriveKey(id);
  const prompt = a['prompt-override'] ?? renderPrompt(id);
  const body = JSON.stringify({ prompt, n: 1, size: SIZES[id.aspectRatio], user: `product:${id.product}` });
  const base = a.url.replace(/\/+$/, '');
  const wait = int('wait');
  const deadline = Date.now() + Number(a.deadline) * 1000;
  log(`key ${key}`);

  const summary = (state, jobId, replayed, outputs, code) => {
    process.stdout.write(JSON.stringify({ key, job_id: jobId, state, replayed, outputs }) + '\n');
    return code;
  };
  const sleepUntilRetry = async (seconds, what) => {
    const left = (deadline - Date.now()) / 1000;
    if (left <= 0) return false;
    const s = Math.min(seconds, left);
    log(`${what}; retrying in ${s.toFixed(0)}s with the same key`);
    await sleep(s * 1000);
    return true;
  };

  // 1. Submit until the gateway has a durable answer. Retrying is safe: same key, same body.
  let job = null;
  let replayed = false;
  for (let attempt = 1; attempt <= int('max-attempts'); attempt++) {
    let r;
    try {
      r = await call('POST', `${base}/v1/providers/${a.route}`, token, {
        body, headers: { 'Idempotency-Key': key, Prefer: `wait=${wait}` }, timeoutMs: (wait + 20) * 1000,
      });
    } catch (e) { // refused, reset, timed out: the same key makes a resend safe
      if (!(await sleepUntilRetry(Math.min(2 ** attempt, 10), `submit: ${e.cause?.code ?? e.cause?.errors?.[0]?.code ?? e.cause?.message ?? e.message}`))) break;
      continue;
    }
    replayed = r.headers.get('idempotent-replayed') === 'true';
    const jobId = r.headers.get('x-idemgate-job-id');
    if (jobId) { // Prefer: wait → the provider's own answer
      const state = r.headers.get('x-idemgate-state');
      if (state === 'completed') return summary(state, jobId, replayed, outputsOf(r.json), EXIT.ok);
      log(`the provider answered ${r.status}: the job is ${state}`);
      return summary(state, jobId, replayed, [], EXIT.failed);
    }
    if (r.status === 200 || r.status === 202) { job = r.json; break; }
    if (r.status === 422) {
      log(`submit: ${problem(r)}`);
      log('this key already names a request with other parameters: a new intended output ' +
          'needs a new identity (bump --prompt-version); not retrying');
      return summary('rejected', null, false, [], EXIT.keyReused);
    }
    if (r.status === 429 || r.status >= 500) {
      if (!(await sleepUntilRetry(retryAfter(r), `submit: ${problem(r)}`))) break;
      continue;
    }
    log(`submit: ${problem(r)}; not retrying`);
    return summary('rejected', null, false, [], EXIT.client);
  }
  if (!job) {
    log('gave up submitting; run again later: the same identity resumes the same job');
    return summary('unsubmitted', null, false, [], EXIT.gaveUp);
  }

  // 2. Poll the job until it is terminal.
  const jobId = job.id;
  let delay = 0.5;
  log(`job ${jobId} is ${job.state}${replayed ? ' (replayed)' : ''}`);
  while (!job.terminal) {
    if (Date.now() + delay * 1000 > deadline) {
      log(`job ${jobId} is still ${job.state}; run again later to resume it`);
      return summary(job.state, jobId, replayed, [], EXIT.gaveUp);
    }
    await sleep(delay * 1000);
    delay = Math.min(delay * 2, 5);
    let r;
    try {
      r = await call('GET', `${base}/v1/jobs/${jobId}`, token, { timeoutMs: 20000 });
    } catch (e) { log(`poll: ${e.cause?.code ?? e.cause?.errors?.[0]?.code ?? e.cause?.message ?? e.message}`); continue; }
    if (r.status === 200) job = r.json;
    else if (r.status === 429 || r.status >= 500) { delay = retryAfter(r); log(`poll: ${problem(r)}`); }
    else { log(`poll: ${problem(r)}; not retrying`); return summary('unknown', jobId, replayed, [], EXIT.client); }
  }
  const result = job.result ?? {};
  if (job.state === 'completed') return summary('completed', jobId, replayed, outputsOf(result.body), EXIT.ok);
  log(`job ${jobId} ended ${job.state}: ${job.last_error} (provider status ${result.status})`);
  return summary(job.state, jobId, replayed, [], EXIT.failed);
}

process.exitCode = await main().catch((e) => { log(e.message); return EXIT.client; });
