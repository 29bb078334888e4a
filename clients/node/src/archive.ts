// What outputs() decides, as pure functions (no I/O, no clock): whether a completed job's
// archived outputs can be downloaded now, must be waited for, or never will be; the name and
// extension a saved output gets; whether downloaded bytes are the archived ones. The same rules
// as the Python client's outputs() (clients/python/idemgate/client.py).
//
// The gateway archives a job's outputs after the job completed (it copies each provider URL or
// base64 result into its own store, under its SHA-256): right after wait() the job's `archive` is
// usually `[]` (not planned yet) or has `pending` records. Only the archived copies are outputs
// (GET /v1/jobs/{id}/outputs/{n}); the provider's URLs expire and are never handed out.

import type { ArchivedOutput, Job } from "./spec.js";
import { TERMINAL_STATES } from "./spec.js";
import { pollDelay } from "./policy.js";

/** How long outputs() and saveOutputs() wait for the gateway's archive by default, in seconds. */
export const OUTPUTS_TIMEOUT_SECONDS = 120;

/** The next thing outputs() does with the job as last read:
 *  `download` the records (in index order; [] for a job planned without outputs);
 *  `probe` output 0 (the job's `archive` is `[]`: not planned yet, or planned without outputs —
 *  the output endpoint tells them apart), then decide again with its problem type;
 *  `read` the job again after `afterSeconds`;
 *  `throw` OutputsUnavailable (`pending`: calling again later can succeed). */
export type OutputsStep =
  | { do: "download"; records: ArchivedOutput[] }
  | { do: "probe" }
  | { do: "read"; afterSeconds: number }
  | { do: "throw"; pending: boolean; message: string };

export interface OutputsProgress {
  /** Reads of the job made so far while waiting (0 for the first decision). */
  polls: number;
  /** Seconds left of the wait (≤ 0: the time is up). */
  leftSeconds: number;
  /** The whole wait, for messages. */
  timeoutSeconds: number;
  /** The problem type's short name of the probe of output 0 made for this read of the job
   *  (`output-not-found`, `output-not-archived`), "" for any other answer; undefined when this
   *  read was not probed yet. */
  probed?: string | undefined;
}

/** The longest a wait of timeoutSeconds reads the job: each read sleeps at least pollDelay(0) or
 *  the time left, so the bound only backs up the clock (e.g. with a sleep replaced in tests). */
export function maxOutputsPolls(timeoutSeconds: number): number {
  return Math.ceil(Math.max(0, timeoutSeconds) / pollDelay(0, "completed")) + 2;
}

function terminal(job: Job): boolean {
  return job.terminal || (TERMINAL_STATES as readonly string[]).includes(job.state);
}

/** outputs()'s decision for the job as last read (see OutputsStep). */
export function outputsStep(job: Job, p: OutputsProgress): OutputsStep {
  if (job.state !== "completed") {
    const done = terminal(job);
    return { do: "throw", pending: !done,
             message: `job ${job.id} is ${job.state}: only a completed job has outputs` +
               (done ? "" : "; wait() for it first") };
  }
  const archive = job.archive;
  if (!Array.isArray(archive)) {
    return { do: "throw", pending: false,
             message: `job ${job.id}: the gateway reports no archive of its outputs (no output archival on this gateway)` };
  }
  const lost = archive.find((o) => o.state === "failed" || o.state === "expired");
  if (lost !== undefined) {
    return { do: "throw", pending: false,
             message: `job ${job.id}: output ${lost.index} is ${lost.state}` +
               (lost.last_error ? `: ${lost.last_error}` : "") + " (the gateway will not archive it)" };
  }
  if (archive.length > 0 && archive.every((o) => o.state === "archived")) {
    return { do: "download", records: [...archive].sort((a, b) => a.index - b.index) };
  }
  if (archive.length === 0) {
    if (p.probed === undefined) return { do: "probe" };
    if (p.probed === "output-not-found") return { do: "download", records: [] };
  }
  // Still to be archived: read the job again while there is time.
  if (p.leftSeconds > 0 && p.polls < maxOutputsPolls(p.timeoutSeconds)) {
    return { do: "read", afterSeconds: Math.min(pollDelay(p.polls, "completed"), p.leftSeconds) };
  }
  const waiting = archive.find((o) => o.state === "pending");
  const what = waiting !== undefined
    ? `output ${waiting.index} is still pending` + (waiting.last_error ? ` (last error: ${waiting.last_error})` : "")
    : "its outputs are not planned for archiving yet";
  return { do: "throw", pending: true,
           message: `job ${job.id}: ${what} after ${p.timeoutSeconds}s; call outputs() again later` };
}

/** Whether what outputs() decides for the job as read can no longer change (then it need not be
 *  read again first): a job that ended other than completed, or a completed job whose every
 *  archive record is final (`archived`, `failed` or `expired`). */
export function archiveSettled(job: Job): boolean {
  if (job.state !== "completed") return terminal(job);
  const a = job.archive;
  return Array.isArray(a) && a.length > 0 &&
    a.every((o) => o.state === "archived" || o.state === "failed" || o.state === "expired");
}

// The extension of a saved output by its content type: the common types of generated media (the
// same table as the Python client's).
const EXTENSIONS: Readonly<Record<string, string>> = {
  "image/png": ".png", "image/jpeg": ".jpg", "image/jpg": ".jpg", "image/webp": ".webp",
  "image/gif": ".gif", "image/avif": ".avif", "image/heic": ".heic", "image/svg+xml": ".svg",
  "image/tiff": ".tif", "image/bmp": ".bmp", "video/mp4": ".mp4", "video/webm": ".webm",
  "video/quicktime": ".mov", "audio/mpeg": ".mp3", "audio/wav": ".wav", "audio/x-wav": ".wav",
  "audio/ogg": ".ogg", "audio/flac": ".flac", "audio/mp4": ".m4a", "application/json": ".json",
  "text/plain": ".txt", "model/gltf-binary": ".glb", "application/pdf": ".pdf",
  "application/zip": ".zip",
};

/** The file extension (with its dot) of a content type: `image/png` .png, `image/jpeg` .jpg,
 *  `video/mp4` .mp4…; `.bin` for a missing, unknown or generic (application/octet-stream) type. */
export function extensionFor(contentType: string | null | undefined): string {
  const t = (contentType ?? "").split(";", 1)[0]!.trim().toLowerCase();
  return EXTENSIONS[t] ?? ".bin";
}

/** The name saveOutputs() gives output index of a job: `{jobId}-{index}{ext}` (a character of
 *  the id outside [A-Za-z0-9._-] becomes `_`, so the name never leaves its folder). */
export function outputFileName(jobId: string, index: number, contentType: string | null | undefined): string {
  return `${jobId.replace(/[^A-Za-z0-9._-]/g, "_")}-${index}${extensionFor(contentType)}`;
}

/** The SHA-256 an output answer's ETag names ("" when none): `"<hex>"`, weak or not. */
export function etagDigest(etag: string | null | undefined): string {
  return (etag ?? "").trim().replace(/^W\//, "").replace(/^"|"$/g, "").toLowerCase();
}

/** What downloaded bytes with SHA-256 `digest` contradict: "the ETag" or "the job's record"
 *  (an absent value contradicts nothing), or undefined when they are the archived bytes. */
export function digestMismatch(digest: string, etag: string | null | undefined,
                               recorded: string | null | undefined): string | undefined {
  const e = etagDigest(etag);
  if (e && e !== digest) return "the ETag";
  if (recorded && recorded.toLowerCase() !== digest) return "the job's record";
  return undefined;
}
