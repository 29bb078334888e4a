// idemgate: a Node/TypeScript client for the idemgate gateway (Node 20+, built-in fetch only).
//
//   import { Client, deriveKey } from "@idemgate/client";
//   const c = new Client({ baseUrl: "http://127.0.0.1:8080", token });
//   const key = deriveKey({ product: "sku-123", template: 3, variant: 1 }, { prefix: "poster-" });
//   const job = await c.wait(await c.submit("mock-images/images/generations", { prompt: "…", n: 1 }, key, { wait: 10 }));
//   const files = await c.saveOutputs(job, "out");   // the gateway's archived bytes: out/{job id}-0.png

export { Client, JobHandle, ProviderResponse } from "./client.js";
export type { ClientOptions, Output, OutputsOptions, RetryEvent, SavedOutput } from "./client.js";
export {
  OUTPUTS_TIMEOUT_SECONDS, archiveSettled, digestMismatch, etagDigest, extensionFor, maxOutputsPolls,
  outputFileName, outputsStep,
} from "./archive.js";
export type { OutputsProgress, OutputsStep } from "./archive.js";
export {
  BudgetExceeded, IdemgateError, IntegrityError, InvalidRequest, KeyReused, NotFound, OutputsUnavailable,
  RateLimited, Rejected, Unauthorized, Unavailable, Unknown, errorFor,
} from "./errors.js";
export type { ErrorDetails } from "./errors.js";
export { canonicalJson, deriveKey } from "./keys.js";
export { EventParser, JobEnded, StreamCut, StreamDiverged, streamAnswerKind, streamEvents } from "./stream.js";
export type { OpenedStream, StreamAnswerKind, StreamEvent } from "./stream.js";
export type { DeriveKeyOptions, Identity, IdentityValue } from "./keys.js";
export {
  RETRY_STATUSES, RetryPolicy, classify, isTransportError, parseRetryAfter, pollDelay,
} from "./policy.js";
export type { AnswerKind, RetryOptions } from "./policy.js";
export { JOB_STATES, PATHS, PROBLEM, TERMINAL_STATES } from "./spec.js";
export type { ArchivedOutput, Job, JobState, Problem, ProblemType, ProviderAnswer } from "./spec.js";
