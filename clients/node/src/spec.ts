// What this client takes from the gateway's contract, docs/openapi.yaml. Every type and name
// below is derived from ./generated/openapi.ts (generated from the spec by openapi-typescript;
// `npm run generate`) or checked against it with `satisfies`: a spec that renames a path, a
// header, a problem type or a member of Job makes `tsc` fail here or where it is used, and the
// test `spec.test.mjs` fails when the committed generated file is not the spec's.

import type { components, operations, paths } from "./generated/openapi.js";

export type Job = components["schemas"]["Job"];
export type JobState = components["schemas"]["JobState"];
export type Problem = components["schemas"]["Problem"];
export type ProviderAnswer = components["schemas"]["ProviderAnswer"];
/** One record of a completed job's `archive`: an output and the state of its copy. */
export type ArchivedOutput = components["schemas"]["ArchivedOutput"];

/** The paths this client calls, as the spec spells them. */
export const PATHS = {
  submit: "/v1/providers/{provider}/{route}",
  job: "/v1/jobs/{id}",
  cancel: "/v1/jobs/{id}/cancel",
  output: "/v1/jobs/{id}/outputs/{n}",
} as const satisfies Record<string, keyof paths>;

/** Request headers of `submit` this client sends. */
export const REQUEST_HEADERS = {
  key: "Idempotency-Key",
  prefer: "Prefer",
} as const satisfies Record<string, keyof operations["submit"]["parameters"]["header"]>;

/** Response headers this client reads (lower-cased when looked up: fetch's Headers ignore case). */
export const RESPONSE_HEADERS = {
  replayed: "Idempotent-Replayed",
  retryAfter: "Retry-After",
  jobId: "X-Idemgate-Job-Id",
  state: "X-Idemgate-State",
  etag: "ETag",
} as const satisfies Record<string, keyof components["headers"]>;

type ProblemTypeOf<R> = R extends { content: { "application/problem+json": infer P } }
  ? P extends { type?: infer T } ? Exclude<T, undefined> : never
  : never;
type ProblemTypesOf<Op extends keyof operations> = {
  [S in keyof operations[Op]["responses"]]: ProblemTypeOf<operations[Op]["responses"][S]>;
}[keyof operations[Op]["responses"]];

/** Every problem type the spec says submit, getJob, cancelJob or getJobOutput can answer. */
export type ProblemType = ProblemTypesOf<"submit"> | ProblemTypesOf<"getJob"> | ProblemTypesOf<"cancelJob"> |
  ProblemTypesOf<"getJobOutput">;

/** The problem types this client tells apart, each one documented by the spec for the
 *  operations it calls (checked by `satisfies`). */
export const PROBLEM = {
  keyReused: "urn:idemgate:problem:idempotency-key-reused",
  rateLimited: "urn:idemgate:problem:rate-limited",
  unauthorized: "urn:idemgate:problem:unauthorized",
  jobNotFound: "urn:idemgate:problem:job-not-found",
  unknownRoute: "urn:idemgate:problem:unknown-route",
  storeBusy: "urn:idemgate:problem:store-busy",
  storeUnavailable: "urn:idemgate:problem:store-unavailable",
  outputNotArchived: "urn:idemgate:problem:output-not-archived",
  outputNotFound: "urn:idemgate:problem:output-not-found",
} as const satisfies Record<string, ProblemType>;

/** Budgets (a 402 `budget-exceeded`) are not in this version of the spec; the Python client
 *  recognises the type already, and so does this one, by status 402 or by this name. */
export const BUDGET_EXCEEDED = "urn:idemgate:problem:budget-exceeded";

/** The states the spec knows, for runtime checks (a typo or a state the spec drops fails tsc). */
export const JOB_STATES = [
  "prepared", "sending", "accepted", "unknown", "review", "completed", "failed", "canceled",
] as const satisfies readonly JobState[];

/** The states that never change again: `completed` (the provider's result is stored), `failed`
 *  (a rejection or a failed task: no task exists) and `canceled` (a task existed and the provider
 *  ended it on our cancel; its remote id and billed cost are kept). */
export const TERMINAL_STATES = ["completed", "failed", "canceled"] as const satisfies readonly JobState[];

// Every state of the spec is listed above (a state the spec adds fails tsc here).
type MissingStates = Exclude<JobState, (typeof JOB_STATES)[number]>;
const _allStates: [MissingStates] extends [never] ? true : MissingStates = true;
void _allStates;
