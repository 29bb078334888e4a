// The idemgate client: submit, wait, get, cancel, outputs, saveOutputs. Node 20's built-in fetch
// and node: modules, nothing else.
//
// Retries follow policy.ts: the same request with the same key, bounded, after
// max(Retry-After, full jitter); a 4xx other than 408/429 throws at once (errors.ts says which).

import { createHash, randomUUID } from "node:crypto";
import { mkdir, open, rename, rm } from "node:fs/promises";
import { join } from "node:path";

import {
  OUTPUTS_TIMEOUT_SECONDS, archiveSettled, digestMismatch, outputFileName, outputsStep,
} from "./archive.js";
import {
  IdemgateError, IntegrityError, OutputsUnavailable, RateLimited, Unavailable, Unknown, errorFor,
} from "./errors.js";
import {
  RETRY_STATUSES, RetryPolicy, classify, describeTransportError, isTransportError, parseRetryAfter, pollDelay,
  type RetryOptions,
} from "./policy.js";
import {
  REQUEST_HEADERS, RESPONSE_HEADERS, TERMINAL_STATES, type ArchivedOutput, type Job, type JobState,
} from "./spec.js";
import { streamEvents, type OpenedStream, type StreamEvent } from "./stream.js";

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

/** One archived output of a completed job, its bytes in memory (outputs()). */
export interface Output {
  index: number;
  /** The gateway's archived bytes, their SHA-256 checked against the ETag and the job's record. */
  data: Uint8Array;
  /** SHA-256 of data, hex. */
  sha256: string;
  /** The size of data. */
  bytes: number;
  /** The archived content type (null when the gateway gave none). */
  contentType: string | null;
  /** `{jobId}-{index}{ext}`, the name saveOutputs() gives it (outputFileName, extensionFor). */
  fileName: string;
}

/** One archived output of a completed job, saved to a file (saveOutputs()). */
export interface SavedOutput {
  index: number;
  /** `dir/{jobId}-{index}{ext}`, the extension from the archived content type. */
  path: string;
  sha256: string;
  bytes: number;
  contentType: string | null;
}

export interface OutputsOptions {
  /** Seconds to wait for the gateway to archive the outputs (default OUTPUTS_TIMEOUT_SECONDS,
   *  120; 0: do not wait). */
  timeoutSeconds?: number;
}

/** Where one download attempt puts the bytes: kept once they are checked, discarded otherwise. */
interface Sink<T> {
  write(chunk: Uint8Array): Promise<void>;
  keep(o: { sha256: string; bytes: number; contentType: string | null }): Promise<T>;
  discard(): Promise<void>;
}

/** The outcome of one download attempt: the value, or why to try again. */
type Attempt<T> =
  | { done: true; value: T }
  | { done: false; why: string; status?: number | undefined; hint?: number | undefined; error?: unknown };

function memorySink(jobId: string, index: number): Sink<Output> {
  const chunks: Uint8Array[] = [];
  return {
    async write(chunk) { chunks.push(chunk); },
    async keep(o) {
      return { index, data: new Uint8Array(Buffer.concat(chunks)), sha256: o.sha256, bytes: o.bytes,
               contentType: o.contentType, fileName: outputFileName(jobId, index, o.contentType) };
    },
    async discard() { chunks.length = 0; },
  };
}

/** A temporary file in dir, fsynced and renamed to `{jobId}-{index}{ext}` when kept, removed when
 *  discarded: a file under the final name is always whole and checked. */
async function fileSink(dir: string, jobId: string, index: number): Promise<Sink<SavedOutput>> {
  const tmp = join(dir, `.part-${randomUUID()}`);
  const fh = await open(tmp, "wx");
  let isOpen = true;
  let kept = false;
  const close = async () => {
    if (isOpen) {
      isOpen = false;
      await fh.close();
    }
  };
  return {
    async write(chunk) {
      for (let off = 0; off < chunk.length; ) {
        const { bytesWritten } = await fh.write(chunk, off, chunk.length - off);
        off += bytesWritten;
      }
    },
    async keep(o) {
      await fh.sync();
      await close();
      const path = join(dir, outputFileName(jobId, index, o.contentType));
      await rename(tmp, path);
      kept = true;
      return { index, path, sha256: o.sha256, bytes: o.bytes, contentType: o.contentType };
    },
    async discard() {
      if (kept) return;
      await close().catch(() => undefined);
      await rm(tmp, { force: true });
    },
  };
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

  /** A streamed LLM call (`"stream": true` is set in an object body): the provider's events, as
   *  they arrive. A connection that drops is opened again with the same key — the gateway replays
   *  its record or joins the live stream — and the events already given are skipped, so each is
   *  seen once. Throws StreamCut (with `jobId`) when no whole stream exists: it was cut at the
   *  provider, paid for, and the job is in doubt; and the errors of submit(). */
  stream(route: string, body: unknown, key: string, options: { wait?: number } = {}): AsyncGenerator<StreamEvent> {
    if (typeof key !== "string" || key === "") {
      throw new TypeError("an Idempotency-Key is required: derive it with deriveKey()");
    }
    const segments = route.split("/").filter((s) => s !== "");
    if (segments.length < 2) throw new TypeError('route must be "provider/route…"');
    const payload = body !== null && typeof body === "object" && !Array.isArray(body) && !(body instanceof Uint8Array)
      ? { ...(body as Record<string, unknown>), stream: true } : body;
    const bytes = payload instanceof Uint8Array ? payload
      : new TextEncoder().encode(typeof payload === "string" ? payload : JSON.stringify(payload));
    const wait = Math.max(1, Math.min(Math.floor(options.wait ?? this.maxWaitSeconds), this.maxWaitSeconds));
    const path = `/v1/providers/${segments.map(encodeURIComponent).join("/")}`;
    const open = async (): Promise<OpenedStream> => {
      const ac = new AbortController();
      // An idle timeout, armed again by every piece that arrives (as the Python client's socket
      // timeout is per read): set once for the whole stream, it cut every stream after 90 s
      // however fast its events came, and each was read again from its start.
      const idleMs = (this.timeoutSeconds + wait) * 1000;
      let timer = setTimeout(() => ac.abort(), idleMs);
      const arm = () => {
        clearTimeout(timer);
        timer = setTimeout(() => ac.abort(), idleMs);
      };
      try {
        const res = await fetch(this.#base + path, {
          method: "POST",
          headers: {
            Authorization: `Bearer ${this.#token}`, Accept: "text/event-stream",
            "User-Agent": "idemgate-node/0.1.0", "Content-Type": "application/json",
            [REQUEST_HEADERS.key]: key, [REQUEST_HEADERS.prefer]: `wait=${wait}`,
          },
          body: bytes,
          redirect: "manual",
          signal: ac.signal,
        });
        const reader = res.body;
        arm();
        return {
          status: res.status, headers: res.headers,
          body: (async function* () {
            if (!reader) return;
            for await (const piece of reader) {
              arm();
              yield piece;
            }
          })(),
          close: () => { clearTimeout(timer); ac.abort(); },
        };
      } catch (e) {
        clearTimeout(timer);
        throw e;
      }
    };
    return streamEvents(open, key, this.retry, this.#sleep, () => this.#random());
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
        const held = submission;
        submission = undefined; // one held request; after it, reads
        try {
          h = await this.#submit(held, Math.min(left, this.maxWaitSeconds));
        } catch (e) {
          // The held request refused in passing each time (too many waits, the store busy): the
          // job exists all the same, read by its id. Thrown, it read as "nothing recorded" to a
          // caller holding a paid job's id.
          if (!(e instanceof RateLimited || e instanceof Unavailable)) throw e;
        }
        continue;
      }
      await this.#sleep(Math.min(pollDelay(reads, h.state), left));
      reads++;
      h = await this.get(h.id);
    }
    return h;
  }

  // -- outputs ------------------------------------------------------------------------------

  /** The archived bytes of every output of a completed job, in index order: the gateway's own
   *  copies (GET /v1/jobs/{id}/outputs/{n}), never the provider's expiring URLs, each checked
   *  against its SHA-256 (the ETag and the job's archive record). [] only for a completed job the
   *  gateway planned without outputs.
   *
   *  The gateway archives a job's outputs after the job completed: right after wait() they are
   *  usually not planned yet (`archive: []`) or `pending`. outputs() waits for them, reading the
   *  job with growing delays, for at most `timeoutSeconds` (default OUTPUTS_TIMEOUT_SECONDS, 120;
   *  0: do not wait). Rejects with OutputsUnavailable (`jobId`, `archive`, and `pending`: whether
   *  calling again later can succeed) when the time runs out (pending true), when an output
   *  ended `failed` or `expired`, the job did not complete or the gateway archives nothing
   *  (pending false); IntegrityError when bytes differ from their SHA-256. Each download is
   *  retried like a read (5xx, 429, transport errors, a body cut short). */
  async outputs(job: JobHandle | string, options: OutputsOptions = {}): Promise<Output[]> {
    const { id, records } = await this.#archived(job, options.timeoutSeconds ?? OUTPUTS_TIMEOUT_SECONDS);
    const out: Output[] = [];
    for (const r of records) out.push(await this.#download(id, r, async () => memorySink(id, r.index)));
    return out;
  }

  /** outputs(), saved into dir (made when missing) as `{jobId}-{n}{ext}`, the extension from the
   *  archived content type (`.png`, `.jpg`, `.mp4`…; `.bin` when the type says nothing:
   *  extensionFor). Each output is streamed to a temporary file beside its name, checked against
   *  its SHA-256, fsynced and renamed into place only then; a failed download leaves nothing. The
   *  same waiting and errors as outputs(). */
  async saveOutputs(job: JobHandle | string, dir: string, options: OutputsOptions = {}): Promise<SavedOutput[]> {
    if (typeof dir !== "string" || dir === "") throw new TypeError("a directory is required");
    const { id, records } = await this.#archived(job, options.timeoutSeconds ?? OUTPUTS_TIMEOUT_SECONDS);
    await mkdir(dir, { recursive: true });
    const out: SavedOutput[] = [];
    for (const r of records) out.push(await this.#download(id, r, () => fileSink(dir, id, r.index)));
    return out;
  }

  /** The job's archive records once every output is archived (outputsStep decides each step). */
  async #archived(job: JobHandle | string, timeoutSeconds: number): Promise<{ id: string; records: ArchivedOutput[] }> {
    if (typeof timeoutSeconds !== "number" || Number.isNaN(timeoutSeconds)) {
      throw new TypeError("timeoutSeconds must be a number of seconds");
    }
    const timeout = Math.max(0, timeoutSeconds);
    const deadline = performance.now() + timeout * 1000;
    let h = job instanceof JobHandle && archiveSettled(job.job) ? job : await this.get(job);
    let probed: string | undefined;
    for (let polls = 0; ;) {
      const step = outputsStep(h.job, { polls, leftSeconds: (deadline - performance.now()) / 1000,
                                        timeoutSeconds: timeout, probed });
      if (step.do === "download") return { id: h.id, records: step.records };
      if (step.do === "throw") {
        throw new OutputsUnavailable(step.message, { jobId: h.id, pending: step.pending,
                                                     archive: h.job.archive ?? [], key: h.key });
      }
      if (step.do === "probe") { // decided again with the answer: a probed read is never probed twice
        probed = await this.#probe(h.id);
        continue;
      }
      await this.#sleep(step.afterSeconds);
      polls++;
      h = await this.get(h.id);
      probed = undefined;
    }
  }

  /** The short problem type of output 0 of a job whose `archive` is [] (`output-not-found`: the
   *  job was planned without outputs; `output-not-archived`: not planned yet), without its bytes
   *  (If-None-Match: * answers 304 for an archived output); "" for any other answer. */
  async #probe(jobId: string): Promise<string> {
    let a: Answer;
    try {
      a = await this.#once("GET", `/v1/jobs/${encodeURIComponent(jobId)}/outputs/0`, undefined,
                           { "If-None-Match": "*" }, this.timeoutSeconds);
    } catch (e) {
      if (isTransportError(e)) return "";
      throw e;
    }
    if (a.status === 404) return errorFor(404, parseJson(a.body)).type;
    if (a.status === 401 || a.status === 403) throw errorFor(a.status, parseJson(a.body));
    return "";
  }

  /** One archived output into the sink open() gives for each attempt, retried with the retry
   *  policy on 408/429/5xx, transport errors and a body cut short. */
  async #download<T>(jobId: string, record: ArchivedOutput, openSink: () => Promise<Sink<T>>): Promise<T> {
    const path = `/v1/jobs/${encodeURIComponent(jobId)}/outputs/${record.index}`;
    const start = performance.now();
    for (let attempt = 1; ; attempt++) {
      const r = await this.#downloadOnce(jobId, path, record, openSink);
      if (r.done) return r.value;
      const d = this.retry.nextDelay(attempt, (performance.now() - start) / 1000, r.hint, this.#random());
      if (d === undefined) {
        throw new Unavailable(`output ${record.index} of job ${jobId}: ${r.why} on each of ${attempt} attempts ` +
                              "(downloading it again later is safe)", { status: r.status, cause: r.error });
      }
      this.#onRetry?.({ method: "GET", path, attempt, delaySeconds: d, key: undefined, status: r.status,
                        retryAfter: r.hint, error: r.error });
      await this.#sleep(d);
    }
  }

  async #downloadOnce<T>(jobId: string, path: string, record: ArchivedOutput,
                         openSink: () => Promise<Sink<T>>): Promise<Attempt<T>> {
    // Cut after timeoutSeconds without a byte, not after timeoutSeconds in all: a long video
    // keeps arriving, a stalled answer does not.
    const ac = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const arm = () => {
      clearTimeout(timer);
      timer = setTimeout(() => ac.abort(new DOMException(`no data for ${this.timeoutSeconds}s`, "TimeoutError")),
                         this.timeoutSeconds * 1000);
    };
    let sink: Sink<T> | undefined;
    const retry = (e: unknown): Attempt<T> => ({ done: false, why: describeTransportError(e), error: e });
    try {
      arm();
      let res: Response;
      try {
        res = await fetch(this.#base + path, {
          headers: { Authorization: `Bearer ${this.#token}`, Accept: "*/*", "User-Agent": "idemgate-node/0.1.0" },
          redirect: "manual",
          signal: ac.signal,
        });
      } catch (e) {
        if (!isTransportError(e)) throw e;
        return retry(e);
      }
      if (res.status !== 200) {
        let body: Uint8Array;
        try {
          body = new Uint8Array(await res.arrayBuffer());
        } catch (e) {
          if (!isTransportError(e)) throw e;
          return retry(e);
        }
        const hint = parseRetryAfter(res.headers.get(RESPONSE_HEADERS.retryAfter), Date.now());
        if (RETRY_STATUSES.has(res.status)) return { done: false, why: `HTTP ${res.status}`, status: res.status, hint };
        const err = errorFor(res.status, parseJson(body));
        if (res.status === 404 && (err.type === "output-not-archived" || err.type === "output-not-found")) {
          throw new OutputsUnavailable(`output ${record.index} of job ${jobId}: ${err.message}`,
                                       { status: 404, problem: err.problem, jobId,
                                         pending: err.type === "output-not-archived" });
        }
        throw err;
      }
      const contentType = res.headers.get("content-type");
      const hash = createHash("sha256");
      let size = 0;
      sink = await openSink();
      try {
        for await (const chunk of (res.body ?? []) as AsyncIterable<Uint8Array>) {
          arm();
          hash.update(chunk);
          await sink.write(chunk);
          size += chunk.length;
        }
      } catch (e) {
        if (!isTransportError(e)) throw e;
        return retry(e);
      }
      const length = res.headers.get("content-length");
      if (length !== null && /^\d+$/.test(length) && Number(length) !== size) {
        return { done: false, why: `${size} of ${length} bytes` };
      }
      const digest = hash.digest("hex");
      const differs = digestMismatch(digest, res.headers.get(RESPONSE_HEADERS.etag), record.sha256);
      if (differs !== undefined) {
        throw new IntegrityError(`output ${record.index} of job ${jobId}: SHA-256 ${digest} differs from ${differs}; ` +
                                 "the download was discarded");
      }
      const value = await sink.keep({ sha256: digest, bytes: size, contentType });
      sink = undefined;
      return { done: true, value };
    } finally {
      clearTimeout(timer);
      if (sink !== undefined) await sink.discard();
    }
  }
}
