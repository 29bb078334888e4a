// The idemgate client: submit, wait, get, cancel, outputs. Node 20's built-in fetch, nothing else.
//
// Retries follow policy.ts: the same request with the same key, bounded, after
// max(Retry-After, full jitter); a 4xx other than 408/429 throws at once (errors.ts says which).

import {
  IdemgateError, OutputsUnavailable, Unavailable, Unknown, errorFor,
} from "./errors.js";
import {
  RetryPolicy, classify, describeTransportError, isTransportError, parseRetryAfter, pollDelay,
  type RetryOptions,
} from "./policy.js";
import { REQUEST_HEADERS, RESPONSE_HEADERS, TERMINAL_STATES, type Job, type JobState } from "./spec.js";

export interface RetryEvent {
  method: string;
  /** The path asked for (no host, no token). */
  path: string;
  /** The attempt that just failed, counted from 1. */
  attempt: number;
  /** Seconds slept before the next attempt. */
  delaySeconds: number;
  /** The Idempotency-Key sent, unchanged on every attempt. */
  key: string | undefined;
  /** The status that is being retried, or undefined for a transport error. */
  status: number | undefined;
  /** The server's Retry-After in seconds, when it sent one. */
  retryAfter: number | undefined;
  /** The transport error, when there was no answer. */
  error: unknown;
}

export interface ClientOptions {
  /** http(s)://host[:port][/prefix] of the gateway. */
  baseUrl: string;
  /** The tenant token (sent as a Bearer token; never put in messages or logs). */
  token: string;
  /** Seconds per attempt (default 30); a `Prefer: wait=N` adds its N. */
  timeoutSeconds?: number;
  /** How retries are bounded (a RetryPolicy, or its options). */
  retry?: RetryPolicy | RetryOptions;
  /** The longest `Prefer: wait` this client asks for (default 60; the gateway caps it too). */
  maxWaitSeconds?: number;
  /** Replaceable for tests and simulations. */
  sleep?: (seconds: number) => Promise<void>;
  random?: () => number;
  /** Called before each retry's sleep. */
  onRetry?: (event: RetryEvent) => void;
}

/** The provider's own answer, as the gateway stored it, returned by a `Prefer: wait` on a
 *  terminal job (status, headers and body exactly as stored). */
export class ProviderResponse {
  constructor(readonly status: number, readonly headers: Headers, readonly body: Uint8Array) {}
  text(): string {
    return new TextDecoder().decode(this.body);
  }
  /** The body parsed as JSON (throws SyntaxError when it is not JSON). */
  json(): unknown {
    return JSON.parse(this.text());
  }
}

interface Submission {
  route: string;
  body: Uint8Array;
  key: string;
}

/** A job as the gateway last showed it. `job` is the gateway's object (the spec's Job);
 *  `replayed` is true when the answer said `Idempotent-Replayed: true`; `answer` is the
 *  provider's own answer when a `Prefer: wait` returned it. */
export class JobHandle {
  /** The request that made the job, when this client submitted it: wait() sends it again with
   *  `Prefer: wait` (a replay). Not enumerable, so that it stays out of logs and JSON. */
  declare readonly submission: Submission | undefined;

  constructor(readonly job: Job, readonly replayed = false, readonly answer?: ProviderResponse,
              submission?: Submission) {
    Object.defineProperty(this, "submission", { value: submission, enumerable: false });
  }

  get id(): string { return this.job.id; }
  get state(): JobState { return this.job.state; }
  /** Never changes again: the gateway's `terminal`, or a state known to be terminal. */
  get terminal(): boolean {
    return this.job.terminal || (TERMINAL_STATES as readonly string[]).includes(this.job.state);
  }
  get key(): string { return this.job.idempotency_key; }
  /** The job completed (rather than failed or canceled): it has a result. */
  get ok(): boolean { return this.job.state === "completed"; }
  /** The provider ended the task on our cancel: terminal, not failed (a task existed; its
   *  `remote_id` and billed cost are kept), and nothing to resubmit. */
  get canceled(): boolean { return this.job.state === "canceled"; }
  /** The provider's task id, when known. */
  get remoteId(): string | null { return this.job.remote_id; }
}

/** One output of a completed job, as the gateway reports it. */
export interface Output {
  index: number;
  /** Where it can be fetched (a provider URL: it may expire, see expiresAt). */
  url?: string;
  /** When the URL expires (Unix seconds), when the provider said. */
  expiresAt?: number;
  /** A base64 result: the data when the provider's body holds it, its size when reported. */
  b64?: string;
  bytes?: number;
}

interface Answer {
  status: number;
  headers: Headers;
  body: Uint8Array;
}

const defaultSleep = (s: number) => new Promise<void>((resolve) => setTimeout(resolve, Math.max(0, s * 1000)));

function parseJson(body: Uint8Array): unknown {
  try {
    return JSON.parse(new TextDecoder().decode(body));
  } catch {
    return {};
  }
}

function jobIdOf(j: JobHandle | string): string {
  const id = j instanceof JobHandle ? j.id : j;
  if (typeof id !== "string" || id === "") throw new TypeError("a job id is required");
  return encodeURIComponent(id);
}

function asJob(a: Answer, what: string): Job {
  const j = parseJson(a.body) as Job;
  if (j === null || typeof j !== "object" || typeof j.id !== "string" || typeof j.state !== "string") {
    throw new IdemgateError(`${what}: the gateway answered ${a.status} without a job`, { status: a.status });
  }
  return j;
}

export class Client {
  readonly timeoutSeconds: number;
  readonly retry: RetryPolicy;
  readonly maxWaitSeconds: number;
  readonly #base: string;
  readonly #token: string;
  readonly #sleep: (seconds: number) => Promise<void>;
  readonly #random: () => number;
  readonly #onRetry: ((e: RetryEvent) => void) | undefined;

  constructor(o: ClientOptions) {
    let u: URL;
    try {
      u = new URL(o.baseUrl);
    } catch {
      throw new TypeError("baseUrl must be http(s)://host[:port][/prefix]");
    }
    if ((u.protocol !== "http:" && u.protocol !== "https:") || u.search || u.hash || u.username) {
      throw new TypeError("baseUrl must be http(s)://host[:port][/prefix]");
    }
    if (!o.token) throw new TypeError("a tenant token is required");
    this.#base = u.origin + u.pathname.replace(/\/+$/, "");
    this.#token = o.token;
    this.timeoutSeconds = o.timeoutSeconds ?? 30;
    this.retry = o.retry instanceof RetryPolicy ? o.retry : new RetryPolicy(o.retry);
    this.maxWaitSeconds = o.maxWaitSeconds ?? 60;
    this.#sleep = o.sleep ?? defaultSleep;
    this.#random = o.random ?? Math.random;
    this.#onRetry = o.onRetry;
  }

  // -- transport ----------------------------------------------------------------------------

  async #once(method: string, path: string, body: Uint8Array | undefined, headers: Record<string, string>,
              timeoutSeconds: number): Promise<Answer> {
    const res = await fetch(this.#base + path, {
      method,
      headers: {
        Authorization: `Bearer ${this.#token}`,
        Accept: "application/json",
        "User-Agent": "idemgate-node/0.1.0",
        ...headers,
      },
      body,
      redirect: "manual",
      signal: AbortSignal.timeout(timeoutSeconds * 1000),
    });
    // Read inside the attempt: a body that breaks off is a transport error like any other.
    const data = new Uint8Array(await res.arrayBuffer());
    return { status: res.status, headers: res.headers, body: data };
  }

  /** The request with bounded retries: an Answer that is a job or a terminal job's stored
   *  answer; throws the errors.ts error otherwise. */
  async #call(method: string, path: string, o: { body?: Uint8Array; headers?: Record<string, string>;
              key?: string; timeoutSeconds?: number } = {}): Promise<Answer> {
    const start = performance.now();
    let last: { answer?: Answer; error?: unknown; hint?: number } = {};
    for (let attempt = 1; attempt <= this.retry.maxAttempts; attempt++) {
      let a: Answer | undefined;
      let error: unknown;
      try {
        a = await this.#once(method, path, o.body, o.headers ?? {}, o.timeoutSeconds ?? this.timeoutSeconds);
      } catch (e) {
        if (!isTransportError(e)) throw e;
        error = e;
      }
      let hint: number | undefined;
      if (a !== undefined) {
        const kind = classify(a.status, a.headers.has(RESPONSE_HEADERS.jobId));
        if (kind === "job" || kind === "job_answer") return a;
        hint = parseRetryAfter(a.headers.get(RESPONSE_HEADERS.retryAfter), Date.now());
        if (kind === "fail") throw errorFor(a.status, parseJson(a.body), { key: o.key, retryAfter: hint });
      }
      last = { answer: a, error, hint };
      const d = this.retry.nextDelay(attempt, (performance.now() - start) / 1000, hint, this.#random());
      if (d === undefined) break;
      this.#onRetry?.({ method, path, attempt, delaySeconds: d, key: o.key, status: a?.status,
                        retryAfter: hint, error });
      await this.#sleep(d);
    }
    const spent = ` (after ${this.retry.maxAttempts === 1 ? "1 attempt" : "the retries"} with the same key; ` +
      `sending the same request again later is safe)`;
    if (last.answer === undefined) {
      throw new Unavailable(`${method} ${path}: ${describeTransportError(last.error)}${spent}`,
                            { key: o.key, cause: last.error });
    }
    throw errorFor(last.answer.status, parseJson(last.answer.body), { key: o.key, retryAfter: last.hint, suffix: spent });
  }

  // -- the API ------------------------------------------------------------------------------

  /** POST /v1/providers/{provider}/{route} with `Idempotency-Key: key`. `route` is
   *  "provider/route" (e.g. "mock-images/images/generations"); `body` an object or array (sent
   *  as JSON) or a string/bytes sent as they are; `wait` seconds of `Prefer: wait`.
   *  Returns the job (replayed when the key already had one). Throws KeyReused, Unauthorized,
   *  BudgetExceeded, InvalidRequest, NotFound… at once; Unavailable or RateLimited when the
   *  retries with the same key ran out. */
  async submit(route: string, body: unknown, key: string, options: { wait?: number } = {}): Promise<JobHandle> {
    if (typeof key !== "string" || key === "") {
      throw new TypeError("an Idempotency-Key is required: derive it with deriveKey()");
    }
    const segments = route.split("/").filter((s) => s !== "");
    if (segments.length < 2) throw new TypeError('route must be "provider/route…"');
    let bytes: Uint8Array;
    if (body instanceof Uint8Array) bytes = body;
    else if (typeof body === "string") bytes = new TextEncoder().encode(body);
    else bytes = new TextEncoder().encode(JSON.stringify(body));
    return this.#submit({ route: segments.map(encodeURIComponent).join("/"), body: bytes, key }, options.wait);
  }

  async #submit(s: Submission, wait: number | undefined): Promise<JobHandle> {
    const headers: Record<string, string> = { "Content-Type": "application/json", [REQUEST_HEADERS.key]: s.key };
    let timeoutSeconds = this.timeoutSeconds;
    if (wait !== undefined && wait > 0) {
      const n = Math.max(1, Math.min(Math.floor(wait), this.maxWaitSeconds));
      headers[REQUEST_HEADERS.prefer] = `wait=${n}`;
      timeoutSeconds += n;
    } else {
      // Never the route's default wait: without `wait` the answer is the job, at once.
      headers[REQUEST_HEADERS.prefer] = "respond-async";
    }
    const a = await this.#call("POST", `/v1/providers/${s.route}`, { body: s.body, headers, key: s.key, timeoutSeconds });
    const replayed = a.headers.get(RESPONSE_HEADERS.replayed) === "true";
    const jobId = a.headers.get(RESPONSE_HEADERS.jobId);
    if (jobId !== null) { // the provider's own answer of a terminal job
      const job = await this.get(jobId);
      return new JobHandle(job.job, replayed, new ProviderResponse(a.status, a.headers, a.body), s);
    }
    return new JobHandle(asJob(a, "submit"), replayed, undefined, s);
  }

  /** GET /v1/jobs/{id} (retried on 5xx, 429 and transport errors: a read is always safe). */
  async get(job: JobHandle | string): Promise<JobHandle> {
    const a = await this.#call("GET", `/v1/jobs/${jobIdOf(job)}`);
    return new JobHandle(asJob(a, "get"));
  }

  /** POST /v1/jobs/{id}/cancel: idempotent, so retried like a read. The job is `failed` at once
   *  when it was not sent yet. One that may have reached the provider is never sent again (the
   *  answer is the job with `cancel_requested_at`, not yet terminal): an accepted async job is
   *  canceled at the provider once, and ends `canceled` when the provider ended it or
   *  `completed` when it finished first — wait() for it. */
  async cancel(job: JobHandle | string): Promise<JobHandle> {
    const a = await this.#call("POST", `/v1/jobs/${jobIdOf(job)}/cancel`, { body: new Uint8Array() });
    return new JobHandle(asJob(a, "cancel"));
  }

  /** Waits up to timeoutSeconds for the job to be terminal and returns it (completed, failed or
   *  canceled: see JobHandle.ok and JobHandle.canceled; none of them is thrown). A job this client submitted is first waited for with `Prefer: wait` (the
   *  same request again, which is a replay: nothing is created); after that, or for a bare id,
   *  the job is read with growing delays (pollDelay), each read retried on 503 after
   *  Retry-After. Throws Unknown (with the job id) when the time runs out. */
  async wait(job: JobHandle | string, options: { timeoutSeconds?: number } = {}): Promise<JobHandle> {
    const timeout = options.timeoutSeconds ?? 120;
    const deadline = performance.now() + timeout * 1000;
    let h = job instanceof JobHandle ? job : await this.get(job);
    let submission = h.submission;
    // Each read sleeps at least pollDelay(0) or the time left; the bound is a backstop.
    const maxReads = Math.ceil(timeout / pollDelay(0, undefined)) + 2;
    for (let reads = 0; !h.terminal; ) {
      const left = (deadline - performance.now()) / 1000;
      if (left <= 0 || reads >= maxReads) {
        throw new Unknown(`job ${h.id} is still ${h.state} after ${timeout}s: its outcome is not known ` +
                          "yet; wait for it again by id (never submit it under a new key)",
                          h.id, { state: h.state, job: h.job, key: h.key });
      }
      if (submission !== undefined && left >= 1 && !h.job.blocked) {
        h = await this.#submit(submission, Math.min(left, this.maxWaitSeconds));
        submission = undefined; // one held request; after it, reads
        continue;
      }
      await this.#sleep(Math.min(pollDelay(reads, h.state), left));
      reads++;
      h = await this.get(h.id);
    }
    return h;
  }

  /** The outputs of a completed job, as the gateway reports them: an async task's
   *  `result.outputs`, else the items of the provider's body's `data` (OpenAI-style `url` or
   *  `b64_json`). Throws OutputsUnavailable for a job that is not completed or names none. */
  async outputs(job: JobHandle | string): Promise<Output[]> {
    const h = job instanceof JobHandle ? job : await this.get(job);
    if (!h.ok) {
      throw new OutputsUnavailable(`job ${h.id} is ${h.state}: only a completed job has outputs`, { key: h.key });
    }
    return outputsOf(h.job);
  }
}

/** outputs() on a job already read. */
export function outputsOf(job: Job): Output[] {
  const r = job.result;
  if (r && Array.isArray(r.outputs)) {
    return r.outputs.map((o, index) => {
      const out: Output = { index };
      if (typeof o.url === "string") out.url = o.url;
      if (typeof o.expires_at === "number") out.expiresAt = o.expires_at;
      if (typeof o.bytes === "number") out.bytes = o.bytes;
      return out;
    });
  }
  const data = (r?.body as { data?: unknown } | null | undefined)?.data;
  if (Array.isArray(data)) {
    return data.map((d: unknown, index) => {
      const out: Output = { index };
      const item = (d ?? {}) as { url?: unknown; b64_json?: unknown };
      if (typeof item.url === "string") out.url = item.url;
      if (typeof item.b64_json === "string") out.b64 = item.b64_json;
      return out;
    });
  }
  throw new OutputsUnavailable(`job ${job.id}: its result names no outputs (neither result.outputs nor a body with data)`,
                               { key: job.idempotency_key });
}
