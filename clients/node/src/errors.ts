// What can go wrong, said precisely. Every error is an IdemgateError.
//
// Answers that are never retried (a 4xx other than 408 and 429) throw at once; answers that are
// retried with the same key (429, 408, 500, 502, 503, 504, timeouts, refused or reset
// connections) throw only when the bounded retries are spent, and then say so.

import { BUDGET_EXCEEDED, PROBLEM, type ArchivedOutput, type Job, type JobState } from "./spec.js";

export interface ErrorDetails {
  /** The HTTP status when there was an answer. */
  status?: number | undefined;
  /** The gateway's problem+json body ({} when there was none). */
  problem?: Record<string, unknown> | undefined;
  /** The Idempotency-Key of the request, when it had one. */
  key?: string | undefined;
  cause?: unknown;
}

export class IdemgateError extends Error {
  readonly status: number | undefined;
  readonly problem: Record<string, unknown>;
  readonly key: string | undefined;

  constructor(message: string, details: ErrorDetails = {}) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    this.name = new.target.name;
    this.status = details.status;
    this.problem = details.problem ?? {};
    this.key = details.key;
  }

  /** The problem type's short name (`idempotency-key-reused`), or "". */
  get type(): string {
    const t = this.problem["type"];
    return typeof t === "string" && t.startsWith("urn:idemgate:problem:") ? t.slice(21) : "";
  }

  get requestId(): string | undefined {
    const r = this.problem["request_id"];
    return typeof r === "string" ? r : undefined;
  }
}

/** A 4xx: the request itself is wrong. Sending it again unchanged cannot change the answer. */
export class Rejected extends IdemgateError {}
/** 400: missing or invalid key, invalid JSON, bad framing. */
export class InvalidRequest extends Rejected {}
/** 401: the tenant token is missing, unknown or revoked. Nothing else will work either. */
export class Unauthorized extends Rejected {}
/** 402 `budget-exceeded`: the tenant's budget would be passed; nothing was sent. */
export class BudgetExceeded extends Rejected {}
/** 404: no such job for this tenant, or a provider/route the gateway does not declare. */
export class NotFound extends Rejected {}
/** 422 `idempotency-key-reused`: the key already names a request with other parameters. A bug in
 *  the caller (the body changed, the identity did not): never retried. */
export class KeyReused extends Rejected {}

/** 429 `rate-limited` on every attempt until the retries ran out. `retryAfter` is the gateway's
 *  last hint in seconds. Nothing was recorded: the same request with the same key later is safe. */
export class RateLimited extends IdemgateError {
  readonly retryAfter: number | undefined;
  constructor(message: string, details: ErrorDetails & { retryAfter?: number | undefined } = {}) {
    super(message, details);
    this.retryAfter = details.retryAfter;
  }
}

/** The gateway could not be reached, timed out, or answered 5xx on every attempt. Nothing is
 *  lost: sending the same request with the same key (`key`) later is safe. */
export class Unavailable extends IdemgateError {}

/** The job exists (`jobId`) but had not finished when the wait ended: its outcome is not known
 *  yet. Do NOT submit it again under a new key: wait for `jobId` later. */
export class Unknown extends IdemgateError {
  readonly jobId: string;
  readonly state: JobState | undefined;
  readonly job: Job | undefined;
  constructor(message: string, jobId: string, details: ErrorDetails & { state?: JobState; job?: Job } = {}) {
    super(message, details);
    this.jobId = jobId;
    this.state = details.state;
    this.job = details.job;
  }
}

/** The job's archived outputs cannot be downloaded. `pending` true: not yet — the job is not
 *  finished, or its outputs were still being archived when outputs() had waited its timeout:
 *  calling again later can succeed. `pending` false: never — the job did not complete, an output
 *  ended `failed` or `expired` (its state and last error in the message), or the gateway archives
 *  nothing. `jobId` names the job; `archive` is its archive records as last read. */
export class OutputsUnavailable extends IdemgateError {
  readonly jobId: string | undefined;
  readonly pending: boolean;
  readonly archive: ArchivedOutput[];
  constructor(message: string, details: ErrorDetails & { jobId?: string | undefined; pending?: boolean;
              archive?: ArchivedOutput[] | undefined } = {}) {
    super(message, details);
    this.jobId = details.jobId;
    this.pending = details.pending ?? false;
    this.archive = details.archive ?? [];
  }
}

/** Downloaded bytes whose SHA-256 differs from the ETag or the job's archive record: discarded
 *  (nothing was returned or left on disk). */
export class IntegrityError extends IdemgateError {}

/** The error for a final answer that is not a job (never retried, or the last of a retried one). */
export function errorFor(status: number, problem: unknown, opts: { key?: string | undefined; retryAfter?: number | undefined; suffix?: string } = {}): IdemgateError {
  const p = problem !== null && typeof problem === "object" && !Array.isArray(problem)
    ? (problem as Record<string, unknown>) : {};
  const type = typeof p["type"] === "string" ? (p["type"] as string) : "";
  const name = type.startsWith("urn:idemgate:problem:") ? type.slice(21) : "";
  const detail = typeof p["detail"] === "string" ? p["detail"] : typeof p["title"] === "string" ? p["title"] : "";
  const msg = `${name ? `${status} ${name}` : `HTTP ${status}`}${detail ? `: ${detail}` : ""}${opts.suffix ?? ""}`;
  const d: ErrorDetails = { status, problem: p, key: opts.key };
  if (status === 401) return new Unauthorized(msg, d);
  if (status === 402 || type === BUDGET_EXCEEDED) return new BudgetExceeded(msg, d);
  if (status === 422 && type === PROBLEM.keyReused) return new KeyReused(msg, d);
  if (status === 429) return new RateLimited(msg, { ...d, retryAfter: opts.retryAfter });
  if (status === 404) return new NotFound(msg, d);
  if (status === 400) return new InvalidRequest(msg, d);
  if (status >= 400 && status < 500) return new Rejected(msg, d);
  return new Unavailable(msg, d);
}
