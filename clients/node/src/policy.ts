// The client's decisions, as pure functions (no I/O, no clock, no randomness of their own): what
// an answer means, when to retry, how long to wait. The same rules as the Python client
// (clients/python/idemgate/policy.py).
//
// The one rule behind them: a retry is only ever the SAME request with the SAME Idempotency-Key,
// so the worst a retry can do is get the existing job back (a replay). That makes 5xx, 429,
// 408, timeouts and refused or reset connections safe to retry; any other 4xx (400, 401, 402,
// 404, 422…) says the request itself is wrong, and sending it again cannot change the answer.

/** What an answer is. */
export type AnswerKind =
  | "job"        // 200/201/202 with a job
  | "job_answer" // `Prefer: wait` on a terminal job: the provider's own answer, any status
  | "retry"      // nothing durable was decided: send the same request again, same key
  | "fail";      // the request is wrong: throw, never retry

export const RETRY_STATUSES: ReadonlySet<number> = new Set([408, 429, 500, 502, 503, 504]);

/** An answer carrying X-Idemgate-Job-Id is the stored answer of a terminal job (after
 *  `Prefer: wait`), whatever its status: a provider's 400 or 503 there is the job's result, not
 *  the gateway's, and is never retried. */
export function classify(status: number, hasJobIdHeader: boolean): AnswerKind {
  if (hasJobIdHeader) return "job_answer";
  if (status === 200 || status === 201 || status === 202) return "job";
  if (RETRY_STATUSES.has(status)) return "retry";
  return "fail";
}

/** True for the failures of a request that left (or may have left) without an answer: refused,
 *  reset, closed, timed out. fetch rejects with a TypeError ("fetch failed", its cause the
 *  socket's error) for these, and with a TimeoutError/AbortError when its signal fires. */
export function isTransportError(e: unknown): boolean {
  const err = e as { name?: unknown; message?: unknown; code?: unknown; cause?: { code?: unknown } } | null;
  if (err === null || typeof err !== "object") return false;
  if (err.name === "TimeoutError" || err.name === "AbortError") return true;
  // undici: "fetch failed" (connect, send, headers) and "terminated" (the body broke off).
  if (e instanceof TypeError && (err.message === "fetch failed" || err.message === "terminated")) return true;
  for (const code of [err.code, err.cause?.code]) {
    if (typeof code === "string" && NETWORK_CODE.test(code)) return true;
  }
  return false;
}

const NETWORK_CODE = /^(ECONNREFUSED|ECONNRESET|ECONNABORTED|EPIPE|EHOSTUNREACH|ENETUNREACH|ENETDOWN|EAI_AGAIN|ETIMEDOUT|UND_ERR_)/;

/** A transport error in a few words, for messages and logs. */
export function describeTransportError(e: unknown): string {
  const err = e as { name?: string; message?: string; cause?: { code?: string; message?: string; errors?: { code?: string }[] } };
  const c = err?.cause;
  const why = c?.code ?? c?.errors?.[0]?.code ?? c?.message;
  return why ? `${err.message ?? err.name} (${why})` : (err?.message ?? String(e));
}

const HTTP_DATE = /^[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT$/;

/** Retry-After as seconds to wait (RFC 9110: delta-seconds or an IMF-fixdate), or undefined when
 *  absent or unreadable. nowMs: the current time, for a date. */
export function parseRetryAfter(value: string | null | undefined, nowMs: number): number | undefined {
  if (value === null || value === undefined) return undefined;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v);
  if (!HTTP_DATE.test(v)) return undefined;
  const when = Date.parse(v);
  if (Number.isNaN(when)) return undefined;
  return Math.max(0, (when - nowMs) / 1000);
}

export interface RetryOptions {
  /** Attempts in all, the first included (default 6). */
  maxAttempts?: number;
  /** No attempt starts later than this many seconds after the first (default 120). */
  deadlineSeconds?: number;
  /** Full-jitter exponential backoff: the n-th delay is drawn from [0, min(cap, base·2^(n-1))). */
  baseSeconds?: number;
  capSeconds?: number;
  /** A Retry-After longer than this is shortened to it (default 300). */
  hintCapSeconds?: number;
}

/** Bounded retries with full-jitter exponential backoff; the server's Retry-After is a floor
 *  (itself capped at hintCapSeconds). Gives up after maxAttempts attempts in all, or when the
 *  next attempt would start after deadlineSeconds from the first. */
export class RetryPolicy {
  readonly maxAttempts: number;
  readonly deadlineSeconds: number;
  readonly baseSeconds: number;
  readonly capSeconds: number;
  readonly hintCapSeconds: number;

  constructor(o: RetryOptions = {}) {
    this.maxAttempts = o.maxAttempts ?? 6;
    this.deadlineSeconds = o.deadlineSeconds ?? 120;
    this.baseSeconds = o.baseSeconds ?? 0.5;
    this.capSeconds = o.capSeconds ?? 30;
    this.hintCapSeconds = o.hintCapSeconds ?? 300;
    if (!Number.isInteger(this.maxAttempts) || this.maxAttempts < 1 || !(this.deadlineSeconds >= 0) ||
        !(this.baseSeconds > 0) || !(this.capSeconds >= this.baseSeconds) || !(this.hintCapSeconds >= 0)) {
      throw new RangeError("invalid retry policy");
    }
  }

  /** Seconds before attempt number attempt+1 (attempt counts from 1). rnd: a number in [0, 1)
   *  drawn by the caller. A hint (Retry-After) is a floor, never shortened by jitter. */
  delay(attempt: number, retryAfter: number | undefined, rnd: number): number {
    const ceiling = Math.min(this.capSeconds, this.baseSeconds * 2 ** Math.min(attempt - 1, 30));
    let d = rnd * ceiling;
    if (retryAfter !== undefined) d = Math.max(d, Math.min(retryAfter, this.hintCapSeconds));
    return d;
  }

  /** The delay before the next attempt, or undefined when the budget is spent. */
  nextDelay(attempt: number, elapsedSeconds: number, retryAfter: number | undefined, rnd: number): number | undefined {
    if (attempt >= this.maxAttempts) return undefined;
    const d = this.delay(attempt, retryAfter, rnd);
    if (elapsedSeconds + d > this.deadlineSeconds) return undefined;
    return d;
  }
}

/** Seconds before reading a job again after `polls` reads: doubling from base up to cap; an
 *  `accepted` job (an async task the gateway itself polls on the provider's hints) is read less
 *  often, up to asyncCap. */
export function pollDelay(polls: number, state: string | undefined, base = 0.25, cap = 5, asyncCap = 15): number {
  const top = state === "accepted" ? asyncCap : cap;
  return Math.min(top, base * 2 ** Math.min(polls, 30));
}
