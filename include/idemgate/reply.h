#ifndef IDEMGATE_REPLY_H
#define IDEMGATE_REPLY_H

#include "idemgate/crypto.h"
#include "idemgate/http_server.h"
#include "idemgate/jobcache.h"
#include "idemgate/store.h"
#include "idemgate/tenants.h"

struct cJSON;

/* The answers the API's handlers share: RFC 9457 problems, store errors, the bearer token, and a
 * job (or the provider's stored result) as a response. */

/* An RFC 9457 problem: type is the last segment of a stable URN ("urn:idemgate:problem:<type>").
 * retry_after > 0 adds a Retry-After header; a 401 "unauthorized" adds WWW-Authenticate; a 405
 * takes its Allow header from detail; a 400 "bad-request-framing" or "bad-header" and a 414
 * "uri-too-long" close the connection. */
int reply_problem(struct hs_req *r, int status, const char *type, const char *title,
                  const char *detail, int retry_after);
/* reply_problem with extra headers (name, value pairs, NULL-terminated, at most 4 pairs), e.g.
 * a 416's Content-Range. */
int reply_problem_with(struct hs_req *r, int status, const char *type, const char *title,
                       const char *detail, const char *const *extra);
/* Answers o as application/json with status and frees it (a 500 when it cannot be printed). */
void reply_json(struct hs_req *r, int status, struct cJSON *o);
/* 503 shutting-down (Retry-After): this replica is draining and starts nothing new. */
void reply_shutting_down(struct hs_req *r);
/* 503 (unreachable, busy; with Retry-After) or 500 for a negative store code. */
void reply_store_error(struct hs_req *r, int e);
void reply_unauthorized(struct hs_req *r);
/* A store error on a tenant's job: 401, 404 (also another tenant's job) or 503/500. */
void reply_job_error(struct hs_req *r, int e);
/* An intake the tenant's budget refused (store.h): 402 "budget-exceeded" for the day's or the
 * month's amount (the estimate, in currency, is in the detail), 429 "too-many-in-flight" with
 * Retry-After for the most jobs in flight. Nothing was recorded or sent. estimate_micros < 0:
 * not told. */
void reply_budget_refused(struct hs_req *r, int e, long long estimate_micros,
                          const char *currency);
/* 422: the key belongs to another operation, job job_id (regeneration: to another request);
 * part (fp_mismatch: "provider", "route" or "body"; NULL: not told) says what differed. */
void reply_key_reused(struct hs_req *r, int regeneration, const char *job_id, const char *part);

/* The SHA-256 of the bearer token, the only form in which tokens are ever compared or stored.
 * Returns 0, or -1 when there is no well-formed bearer token (or there are two). */
int reply_token_hash(struct hs_req *r, char out[CRYPTO_SHA256_HEX]);
/* On a database worker: the caller's tenant (tenants.h) from its bearer token (hashed into
 * token). Answers 401 (no well-formed token, or no live tenant's) or the store's error and
 * returns -1; 0 with *t. */
int reply_caller_tenant(struct hs_req *r, char token[CRYPTO_SHA256_HEX], struct tenant *t);
/* 1 when the request carries the admin token (its SHA-256 is configured). Answers nothing. */
int reply_is_admin(struct hs_req *r);

/* A job as JSON, with Location (with_location) and Idempotent-Replayed (replayed). */
void reply_entry(struct hs_req *r, int status, const struct jobcache_entry *e, int replayed,
                 int with_location);
void reply_job(struct hs_req *r, int status, const struct store_job *j, int replayed,
               int with_location);
/* How the client of a streamed provider asked for its answer: the provider's event format
 * (sse.h; 0 for any other provider) and whether this request said "stream": true. */
struct reply_delivery {
    int format;
    int stream;
};
/* `Prefer: wait` on a terminal job: the provider's own status, body and content type, with the
 * job's headers, as if the client had called the provider itself (the job when none is stored).
 * For a streamed provider's 2xx (dv not NULL), the record is served the way this client asked:
 * a recorded stream as the whole answer it stands for (sse_assemble), a recorded whole answer
 * as its events (sse_synthesize); as stored when it cannot be. */
void reply_result(struct hs_req *r, const struct jobcache_entry *e, int replayed, int wait_s,
                  const struct reply_delivery *dv);
void reply_provider_result(struct hs_req *r, const struct store_job *j, int replayed, int wait_s,
                           const struct reply_delivery *dv);
/* Remembers a terminal job for later replays (by key) and reads (by id) of this tenant. */
void reply_cache_terminal(const char *token, const struct store_job *j);

#endif
