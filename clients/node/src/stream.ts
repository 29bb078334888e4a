// Streamed LLM calls through the gateway: server-sent events as they arrive, resumed by key.
//
// A dropped connection is not a lost generation: the gateway records the stream, so the same
// key and body sent again replays it from the record (or joins it while it is still live on
// that replica). The replay is the same events byte for byte, so those already handed to the
// caller are skipped and each event is seen once — each is checked to be the one given, and a
// record that differs raises StreamDiverged rather than skip on a guess. A stream cut at the
// provider (no terminal event) was paid for and is in doubt: the job is `unknown`; StreamCut
// says so, with its id.

import { IdemgateError, Unavailable, Unknown, errorFor } from "./errors.js";
import { RetryPolicy, classify, isTransportError, parseRetryAfter } from "./policy.js";
import { TERMINAL_STATES, type Job, type JobState } from "./spec.js";

/** One server-sent event: its type (`event:`, or undefined) and its data lines, joined. */
export interface StreamEvent {
  event: string | undefined;
  data: string;
}

/** No whole stream exists (cut at the provider, paid for): `jobId` names the job in doubt. */
export class StreamCut extends IdemgateError {
  readonly jobId: string | undefined;
  constructor(message: string, jobId: string | undefined, status: number | undefined, key: string) {
    super(message, { status, key });
    this.name = "StreamCut";
    this.jobId = jobId;
  }
}

/** The key's job has ended without a stream to give: the answer is its stored end — the
 *  provider's own refusal (any status, 4xx and 5xx too) or the gateway's `502 job-failed` /
 *  `409 job-canceled`. Final: not an outage to retry, nothing to resend. `jobId` names the job,
 *  `state` is its X-Idemgate-State, `body` the answer's text. */
export class JobEnded extends IdemgateError {
  readonly jobId: string | undefined;
  readonly state: string | undefined;
  readonly body: string;
  constructor(message: string, jobId: string | undefined, state: string | undefined, status: number,
              body: string, key: string) {
    super(message, { status, key });
    this.name = "JobEnded";
    this.jobId = jobId;
    this.state = state;
    this.body = body;
  }
}

/** The record replayed after a cut is not the stream already given: its first events differ
 *  from those yielded (the provider refused the first attempt with an error event before any
 *  output and a later attempt generated, or the cut stream was read back whole from the
 *  provider). Nothing is skipped on a guess: call stream() again with the same key to read the
 *  record from its start. */
export class StreamDiverged extends IdemgateError {
  readonly jobId: string | undefined;
  constructor(message: string, jobId: string | undefined, key: string) {
    super(message, { key });
    this.name = "StreamDiverged";
    this.jobId = jobId;
  }
}

const same = (a: StreamEvent, b: StreamEvent) => a.event === b.event && a.data === b.data;

/** Reads WHATWG's event stream from pieces of bytes as they come: a blank line dispatches, `:`
 *  starts a comment, an event cut off before its blank line is never given. */
export class EventParser {
  #buf = "";
  #decoder = new TextDecoder();
  #event: string | undefined;
  #data: string[] = [];
  #have = false;

  /** The events completed by this piece. */
  push(piece: Uint8Array): StreamEvent[] {
    this.#buf += this.#decoder.decode(piece, { stream: true });
    const out: StreamEvent[] = [];
    for (;;) {
      const m = /\r\n|\r|\n/.exec(this.#buf);
      // A lone CR at the end may be the first half of a CRLF: wait for the next piece.
      if (!m || (m[0] === "\r" && m.index === this.#buf.length - 1)) break;
      const line = this.#buf.slice(0, m.index);
      this.#buf = this.#buf.slice(m.index + m[0].length);
      if (line === "") {
        if (this.#have || this.#event !== undefined) out.push({ event: this.#event, data: this.#data.join("\n") });
        this.#event = undefined;
        this.#data = [];
        this.#have = false;
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const name = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (name === "event") this.#event = value;
      else if (name === "data") {
        this.#data.push(value);
        this.#have = true;
      }
    }
    return out;
  }
}

/** What opening a streamed create gives: the status, the headers, the body's pieces as they
 *  arrive (an iterable that throws when the connection breaks before the body ended), and how
 *  to let go of it. */
export interface OpenedStream {
  status: number;
  headers: Headers;
  body: AsyncIterable<Uint8Array>;
  close: () => void;
}

/** What an answer that is not an event stream means: the job's stored end (final), the job in
 *  doubt (`unknown`, `review`: its stream was cut at the provider), the job still on its way
 *  (the wait ran out before its first output: open again with the same key), the gateway's
 *  passing refusal (429, 5xx: back off, same key), or the request's fault. */
export type StreamAnswerKind = "ended" | "cut" | "pending" | "retry" | "fail";

/** What a stream's open answered without an event stream means, and the job's state when it
 *  names one. Pure. A job document (202: the wait ran out before the first output — a model
 *  thinking, a provider's 429 backed off, the record on another replica — or a 2xx job) is read
 *  by its state. Before, every 202 was a StreamCut ("paid and in doubt"), and a caller that took
 *  it for a failure and asked again under a new key paid twice; a 503 or a 429 was thrown at
 *  once, never retried. */
export function streamAnswerKind(status: number, headers: Headers, text: string,
                                 hadJob: boolean): { kind: StreamAnswerKind; state: string | undefined } {
  const ok = status >= 200 && status < 300;
  let job: Record<string, unknown> | undefined;
  if (ok) {
    try {
      const doc: unknown = JSON.parse(text || "null");
      if (doc !== null && typeof doc === "object" && !Array.isArray(doc) &&
          typeof (doc as Record<string, unknown>).state === "string" && "id" in doc) {
        job = doc as Record<string, unknown>;
      }
    } catch { job = undefined; }
  }
  if (job !== undefined) {
    const state = job.state as string;
    if (job.terminal === true || (TERMINAL_STATES as readonly string[]).includes(state)) {
      return { kind: "ended", state };
    }
    return { kind: state === "unknown" || state === "review" ? "cut" : "pending", state };
  }
  const named = headers.get("x-idemgate-job-id") !== null;
  if (status === 202 || (ok && (hadJob || named))) return { kind: "cut", state: undefined };
  // The job's stored end, whatever the status: not the gateway's refusal, never an outage.
  if (named) return { kind: "ended", state: headers.get("x-idemgate-state") ?? undefined };
  return { kind: classify(status, false) === "retry" ? "retry" : "fail", state: undefined };
}

/** The generator behind Client.stream. `open` sends the request (the same key every time);
 *  `retry` bounds the attempts (a number: that many, the default backoff) and spaces the
 *  openings after a passing refusal. */
export async function* streamEvents(open: () => Promise<OpenedStream>, key: string,
                                    retry: RetryPolicy | number,
                                    sleep: (s: number) => Promise<void>,
                                    random: () => number = Math.random): AsyncGenerator<StreamEvent> {
  const policy = typeof retry === "number" ? new RetryPolicy({ maxAttempts: retry }) : retry;
  const maxAttempts = policy.maxAttempts;
  const given: StreamEvent[] = []; // what the caller already has, to check each replay against
  let jobId: string | undefined;
  const start = performance.now();
  for (let attempt = 1; ; attempt++) {
    let o: OpenedStream;
    try {
      o = await open();
    } catch (e) {
      if (!isTransportError(e) || attempt >= maxAttempts) {
        if (e instanceof IdemgateError || !isTransportError(e)) throw e;
        throw new Unavailable(`stream ${key}: ${String(e)} on each of ${attempt} attempts (the same key may be sent again later)`, { key });
      }
      await sleep(Math.min(1, 0.05 * attempt));
      continue;
    }
    let whole = false;
    let retryIn: number | undefined;
    let again = false;
    try {
      jobId = o.headers.get("x-idemgate-job-id") ?? jobId;
      if (!(o.headers.get("content-type") ?? "").startsWith("text/event-stream")) {
        const chunks: Uint8Array[] = [];
        for await (const c of o.body) chunks.push(c);
        const text = new TextDecoder().decode(Buffer.concat(chunks));
        const { kind, state } = streamAnswerKind(o.status, o.headers, text, jobId !== undefined);
        if (kind === "ended") {
          throw new JobEnded(`job ${jobId} ended ${state ?? ""} (HTTP ${o.status})`, jobId, state,
                             o.status, text, key);
        }
        if (kind === "cut") {
          throw new StreamCut(`job ${jobId}: no whole stream to give (HTTP ${o.status})`, jobId, o.status, key);
        }
        let problem: unknown = {};
        try { problem = JSON.parse(text || "{}"); } catch { problem = {}; }
        if (problem === null || typeof problem !== "object" || Array.isArray(problem)) problem = {};
        const doc = problem as Record<string, unknown>;
        if (kind === "pending") {
          if (typeof doc.id === "string") jobId = doc.id;
          if (attempt >= maxAttempts) {
            throw new Unknown(`job ${jobId} is still ${state} after ${attempt} waits: its stream has ` +
              "not begun; stream it again with the same key, or wait for the job by id — never a new key",
              jobId ?? "", { state: state as JobState, job: doc as unknown as Job, key });
          }
          again = true;
        } else {
          const hint = parseRetryAfter(o.headers.get("retry-after"), Date.now());
          if (kind === "retry") {
            retryIn = policy.nextDelay(attempt, (performance.now() - start) / 1000, hint, random());
          }
          if (retryIn === undefined) {
            throw errorFor(o.status, doc, {
              key, retryAfter: hint,
              ...(kind === "retry" ? { suffix: ` (after ${attempt} attempts with the same key)` } : {}),
            });
          }
          again = true;
        }
      } else {
        const parser = new EventParser();
        let n = 0;
        try {
          for await (const piece of o.body) {
            for (const ev of parser.push(piece)) {
              n++;
              if (n > given.length) {
                given.push(ev);
                yield ev;
              } else if (!same(given[n - 1]!, ev)) {
                throw new StreamDiverged(`stream ${key}: the record differs from the ${given.length} ` +
                  `events already given (event ${n}); read it again from the start`, jobId, key);
              }
            }
          }
          whole = true; // the body ended: the stream is whole
        } catch (e) {
          if (e instanceof IdemgateError || !isTransportError(e)) throw e;
        }
      }
    } finally {
      o.close();
    }
    if (whole) return;
    if (retryIn !== undefined && retryIn > 0) await sleep(retryIn);
    if (again) continue;
    if (attempt >= maxAttempts) throw new Unavailable(`stream ${key}: cut on each of ${attempt} attempts`, { key });
  }
}
