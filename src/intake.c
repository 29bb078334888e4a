#include "idemgate/intake.h"

#include "idemgate/answers.h"
#include "idemgate/api.h"
#include "idemgate/archive.h"
#include "idemgate/attempt.h"
#include "idemgate/clock.h"
#include "idemgate/crash.h"
#include "idemgate/crypto.h"
#include "idemgate/fingerprint.h"
#include "idemgate/gate.h"
#include "idemgate/headers.h"
#include "idemgate/inject.h"
#include "idemgate/jcs.h"
#include "idemgate/jobcache.h"
#include "idemgate/limits.h"
#include "idemgate/livestream.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/multipart.h"
#include "idemgate/provider.h"
#include "idemgate/recorder.h"
#include "idemgate/reply.h"
#include "idemgate/reqbody.h"
#include "idemgate/sse.h"
#include "idemgate/store.h"
#include "idemgate/tenants.h"
#include "idemgate/upload.h"
#include "idemgate/uplstore.h"
#include "idemgate/wake.h"
#include "idemgate/waiters.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* A problem a step raised; answered by the gate (raise_problem → answer_problem). */
struct intake_problem {
    int status;
    const char *type, *title;
    char detail[400];
    int key_reused;  /* the 422 of reply_key_reused(): the key's job, and what differed */
    char owner[32];
    const char *part;
    int retry_after; /* seconds, or 0 */
};

/* One intake request on its way through the steps. */
struct intake {
    struct hs_req *r;
    const struct cfg *cfg;
    const char *target; /* "{provider}/{route}" */
    char token[CRYPTO_SHA256_HEX];
    struct tenant tenant; /* the token's, once authenticated */
    const struct cfg_provider *p;
    const struct cfg_route *rt;
    char key[HDR_KEY_MAX + 1];
    int wait_s;
    struct reqbody body; /* canonical (fingerprinted) and sent (stored) forms, requested count */
    /* A multipart/form-data body: its canonical form (fingerprinted instead of body.canon) and
     * the client's bytes (stored and sent instead of body.sent, which holds its text fields as
     * JSON for the gate's prices). mp_canon NULL for a JSON body. */
    char *mp_canon;
    size_t mp_canon_len;
    const char *mp_raw;
    size_t mp_raw_len;
    /* Its parts (pointing into mp_raw), and the form the row keeps when its large parts went to
     * the archive store (step_stage; upload.h), or NULL when the row keeps mp_raw. */
    struct mp_part *mp_parts;
    size_t mp_n;
    char *mp_stored;
    size_t mp_stored_len;
    char fp[CRYPTO_SHA256_HEX];
    struct gate_pass pass; /* the tenant gate's estimate for the record (gate.h) */
    char job_id[CRYPTO_JOB_ID_LEN];
    char *url; /* the provider URL, made when the intent is recorded */
    struct rec_item rec; /* the intent on its way through the recorder, and its answer */
    atomic_int recorded; /* the recorder is done with rec (release/acquire) */
    size_t next_step;    /* where a resumed intake goes on */
    struct store_job job;
    int have_job, created;
    int wait_counted; /* a `Prefer: wait` connection counted against the tenant's limit */
    struct intake_problem problem;
    /* A streamed request that waits: the job's live stream on this replica (livestream.h),
     * or NULL; and when the wait ends (waiters_now() seconds). */
    struct ls *ls;
    int ls_new; /* ls was opened for job_id and not yet handed over or closed */
    double wait_deadline;
    struct reply_delivery dv; /* how a streamed provider's answer is served to this client */
};

/* The delivery the client of r asked for (its intake's), or NULL. */
static const struct reply_delivery *delivery_of(struct hs_req *r)
{
    struct intake *in = api_ctx(r);
    return in ? &in->dv : NULL;
}

/* NEXT: go on; ANSWERED or PROBLEM: stop (the gate answers a problem); SUSPENDED: the request
 * waits for the recorder, and goes on at next_step once resumed. */
enum step_result { STEP_NEXT = 0, STEP_ANSWERED, STEP_PROBLEM, STEP_SUSPENDED };

static enum step_result raise_problem(struct intake *in, int status, const char *type,
                                      const char *title, const char *detail)
{
    in->problem.status = status;
    in->problem.type = type;
    in->problem.title = title;
    snprintf(in->problem.detail, sizeof(in->problem.detail), "%s", detail);
    return STEP_PROBLEM;
}

/* The key holds job `owner` of provider and route stored_provider/stored_route. */
static enum step_result raise_key_reused(struct intake *in, const char *owner,
                                         const char *stored_provider, const char *stored_route)
{
    in->problem.status = 422;
    in->problem.key_reused = 1;
    snprintf(in->problem.owner, sizeof(in->problem.owner), "%s", owner ? owner : "");
    in->problem.part = fp_mismatch(stored_provider, stored_route, in->p->name, in->rt->route);
    return STEP_PROBLEM;
}

/* The problem a step raised, answered: the caller is already proven a tenant (authenticate runs
 * first), so it may learn what was wrong. */
static void answer_problem(struct intake *in)
{
    const struct intake_problem *pb = &in->problem;
    if (pb->key_reused)
        reply_key_reused(in->r, 0, pb->owner, pb->part);
    else
        reply_problem(in->r, pb->status, pb->type, pb->title, pb->detail, pb->retry_after);
}

static void intake_continue(struct hs_req *r);

/* On a database worker: the tenant of a token the directory could not tell (tenants.h); the
 * request goes on at its next step, or is answered 401. */
static void resolve_tenant(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    struct intake *in = api_ctx(r);
    int e = tenants_get(api_db(r), in->token, &in->tenant);
    if (e == STORE_OK)
        api_set_continuation(r, intake_continue);
    else if (e == STORE_EAUTH)
        reply_unauthorized(r);
    else
        reply_store_error(r, e);
}

/* authenticate: a well-formed bearer token, hashed, and the live tenant whose it is (tenants.h):
 * from memory, or read once on a database worker. Nothing else is looked at before: an
 * unauthenticated client learns nothing about routes or validation. */
static enum step_result step_authenticate(struct intake *in)
{
    if (reply_token_hash(in->r, in->token) < 0) {
        reply_unauthorized(in->r);
        return STEP_ANSWERED;
    }
    api_tenants_refresh(in->r);
    int known = tenants_lookup(in->token, &in->tenant);
    if (known > 0)
        return STEP_NEXT;
    if (known < 0) {
        reply_unauthorized(in->r);
        return STEP_ANSWERED;
    }
    if (api_offload(in->r, resolve_tenant, NULL) < 0) {
        reply_shutting_down(in->r); /* the database workers have stopped */
        return STEP_ANSWERED;
    }
    return STEP_SUSPENDED;
}

/* validate: the body's size, a declared provider route, one well-formed Idempotency-Key. */
static enum step_result step_validate(struct intake *in)
{
    char detail[96];
    if (hs_req_body_too_large(in->r)) {
        const char *ct = hs_req_header(in->r, "Content-Type");
        const char *slash = strchr(in->target, '/');
        const struct cfg_provider *p =
            slash ? cfg_find_provider(in->cfg, in->target, (size_t)(slash - in->target)) : NULL;
        const struct cfg_route *rt = p ? cfg_find_route(p, slash + 1, strlen(slash + 1)) : NULL;
        int upload = ct && strncasecmp(ct, "multipart/form-data", 19) == 0 && rt && rt->multipart;
        snprintf(detail, sizeof(detail), "the body exceeds %ld bytes",
                 upload ? in->cfg->max_upload_bytes : in->cfg->max_body_bytes);
        return raise_problem(in, 413, "payload-too-large", "Payload too large", detail);
    }
    const char *slash = strchr(in->target, '/');
    in->p = slash ? cfg_find_provider(in->cfg, in->target, (size_t)(slash - in->target)) : NULL;
    in->rt = in->p ? cfg_find_route(in->p, slash + 1, strlen(slash + 1)) : NULL;
    if (!in->rt) {
        char why[sizeof(in->problem.detail)];
        cfg_explain_unknown_target(in->cfg, in->target, why, sizeof(why));
        return raise_problem(in, 404, "unknown-route", "Unknown provider route", why);
    }
    size_t key_len = 0;
    const char *raw_key = hs_req_header_n(in->r, "Idempotency-Key", &key_len);
    if (!raw_key)
        return raise_problem(in, 400, "missing-idempotency-key", "Missing Idempotency-Key",
                             "send an Idempotency-Key header that identifies the intended output");
    if (hs_req_header_count(in->r, "Idempotency-Key") != 1 ||
        hdr_idempotency_key(raw_key, key_len, in->key) < 0)
        return raise_problem(in, 400, "invalid-idempotency-key", "Invalid Idempotency-Key",
                             "one key of 1 to 255 printable ASCII characters, bare or as an RFC "
                             "8941 quoted string");
    /* No Prefer at all (an SDK that cannot send one): the route's default wait, so that it
     * receives the provider's own body when the job ends in time. Any Prefer is the client's
     * choice (`Prefer: wait=0` or `respond-async`: no wait). */
    const char *prefer = hs_req_header(in->r, "Prefer");
    int cap = in->cfg->max_wait_seconds;
    in->wait_s = prefer ? hdr_prefer_wait(prefer, cap)
                        : (in->rt->default_wait_s < cap ? in->rt->default_wait_s : cap);
    return STEP_NEXT;
}

/* limit: the tenant's `Prefer: wait` connections held (limits.h), from memory. Only live
 * tenants are limited (their tokens come from the database), so a 429 tells an unproven token
 * nothing. Nothing is recorded over a limit. (Its requests per second are the tenant gate's:
 * step_gate.) */
static enum step_result step_limit(struct intake *in)
{
    api_limits_refresh(in->r);
    int waits = in->wait_s > 0 ? limits_wait_begin(in->token, &in->wait_counted) : 0;
    if (!waits)
        return STEP_NEXT;
    in->problem.retry_after = waits;
    return raise_problem(in, 429, "rate-limited", "Too many requests",
                         "this tenant holds as many `Prefer: wait` connections as it may; retry "
                         "later, or without `Prefer: wait` and poll the job");
}

/* A multipart/form-data body, on a route that takes one: read strictly (multipart.h), its
 * canonical form kept for the fingerprint and its bytes for the record, exactly as they came.
 * Its text fields, as JSON, are left in in->body.sent for the profile's paths to read. */
static enum step_result read_multipart(struct intake *in, const char *ctype, const char *raw,
                                       size_t len, int ref_needed)
{
    char detail[sizeof(in->problem.detail)], why[128], boundary[MP_BOUNDARY_MAX + 1];
    if (!in->rt->multipart) {
        snprintf(detail, sizeof(detail),
                 "route %s/%s takes JSON bodies; multipart/form-data is taken on routes whose "
                 "profile says \"multipart\": true",
                 in->p->name, in->rt->route);
        return raise_problem(in, 415, "unsupported-media-type", "Unsupported media type", detail);
    }
    if (strncasecmp(ctype, "multipart/form-data", 19) != 0)
        return raise_problem(in, 415, "unsupported-media-type", "Unsupported media type",
                             "of multipart bodies, only multipart/form-data is taken");
    if (ref_needed) {
        snprintf(detail, sizeof(detail),
                 "this provider's reconciliation needs the gateway's reference at \"%s\" in a "
                 "JSON body; a multipart body cannot carry it",
                 in->p->client_ref_body_field);
        return raise_problem(in, 422, "client-ref-unplaceable",
                             "Client reference cannot be placed", detail);
    }
    if (mp_boundary(ctype, boundary) < 0)
        return raise_problem(in, 400, "invalid-multipart", "Invalid multipart body",
                             "the Content-Type has no valid boundary parameter (1 to 70 "
                             "characters, RFC 2046)");
    struct mp_part *parts = malloc(MP_MAX_PARTS * sizeof(*parts));
    size_t n = 0;
    if (!parts)
        return raise_problem(in, 500, "internal", "Internal error", "out of memory");
    if (mp_parse(raw, len, boundary, parts, MP_MAX_PARTS, &n, why, sizeof(why)) < 0) {
        free(parts);
        return raise_problem(in, 400, "invalid-multipart", "Invalid multipart body", why);
    }
    /* The text fields are read as a JSON body is (fingerprint, price, outputs) and held in
     * several copies: together they are held to a JSON body's bound. Only files take the
     * upload's (a 25 MiB text field made ~200 MiB of copies no bound counted). */
    size_t text = 0;
    for (size_t i = 0; i < n; i++)
        if (!parts[i].filename)
            text += parts[i].data_len;
    if (text > (size_t)in->cfg->max_body_bytes) {
        free(parts);
        snprintf(detail, sizeof(detail),
                 "the text fields of this multipart body hold %zu bytes, over max_body_bytes "
                 "(%zu): large content goes in file parts",
                 text, (size_t)in->cfg->max_body_bytes);
        return raise_problem(in, 413, "payload-too-large", "Payload too large", detail);
    }
    long amb = mp_ambiguous_field(parts, n);
    if (amb >= 0) {
        int nl = parts[amb].name_len > 64 ? 64 : (int)parts[amb].name_len;
        snprintf(detail, sizeof(detail),
                 "the text field \"%.*s\" is repeated or its name holds an escape: providers "
                 "read such fields differently (the first value, the last), so the request "
                 "cannot be priced or fingerprinted as it will be read; send each field once "
                 "(a list as name[])",
                 nl, parts[amb].name);
        free(parts);
        return raise_problem(in, 400, "invalid-multipart", "Invalid multipart body", detail);
    }
    long own = mp_part_under_member(parts, n, in->p->client_ref_body_field);
    if (own >= 0) {
        int nl = parts[own].name_len > 64 ? 64 : (int)parts[own].name_len;
        snprintf(detail, sizeof(detail),
                 "the part \"%.*s\" is where this provider reads the gateway's reference (\"%s\"); "
                 "that member is the gateway's: send the body without it",
                 nl, parts[own].name, in->p->client_ref_body_field);
        free(parts);
        return raise_problem(in, 422, "client-ref-unplaceable",
                             "Client reference cannot be placed", detail);
    }
    size_t flen = 0;
    in->mp_canon = mp_canonical(parts, n, &in->mp_canon_len);
    char *fields = mp_fields_json(parts, n, &flen);
    in->mp_parts = parts; /* for step_stage */
    in->mp_n = n;
    if (!in->mp_canon || !fields) {
        free(fields);
        return raise_problem(in, 500, "internal", "Internal error", "out of memory");
    }
    in->mp_raw = raw;
    in->mp_raw_len = len;
    in->body.sent = fields; /* taken back by step_canonicalise */
    in->body.sent_len = flen;
    return STEP_NEXT;
}

/* canonicalise: one strict parse of the client's bytes (the body is refused here when it is not
 * unambiguous JSON) gives the RFC 8785 form, and what the record needs from the client's own
 * bytes: those bytes compacted (the canonical form would round numbers beyond 2^53 on their way
 * to the provider), whether the client reference fits in them, and the outputs asked for. */
static enum step_result step_canonicalise(struct intake *in)
{
    const struct cfg_provider *p = in->p;
    struct jcs_error jerr;
    char detail[160];
    size_t len = 0;
    const char *raw = hs_req_body(in->r, &len);
    /* A create whose reconciliation finds the task by our client reference never leaves
     * without it: when the body leaves no place for it, the client learns it now. Whatever the
     * strategy, the member is the gateway's: a webhook or a task read proves a task ours by the
     * reference the provider echoes from there, and one the client wrote (another job's id)
     * would hand it a task that is not its job's. */
    int ref_needed =
        p->client_ref_body_field && attempt_needs_client_ref(prof_reconcile_name(p->reconcile));
    struct reqbody_needs needs = {.max_depth = in->cfg->max_json_depth,
                                  .client_ref_field = p->client_ref_body_field,
                                  .outputs_path = p->outputs_requested,
                                  .outputs_default = p->outputs_default,
                                  .outputs_counted = prof_counts_outputs(p),
                                  .fp_skip = p->stream_format ? sse_delivery_members : NULL};
    const char *ctype = hs_req_header(in->r, "Content-Type");
    if (ctype && strncasecmp(ctype, "multipart/", 10) == 0) {
        enum step_result m = read_multipart(in, ctype, raw, len, ref_needed);
        if (m != STEP_NEXT)
            return m;
        /* The profile's paths (outputs asked for, price keys) read the text fields. */
        needs.client_ref_field = NULL;
        raw = in->body.sent;
        len = in->body.sent_len;
        in->body.sent = NULL;
    }
    char *fields = (char *)(in->mp_canon ? raw : NULL);
    int je = reqbody_init(&in->body, raw, len, &needs, &jerr);
    free(fields);
    if (je == JCS_ENOMEM)
        return raise_problem(in, 500, "internal", "Internal error", "out of memory");
    if (je < 0 && in->mp_canon)
        return raise_problem(in, 400, "invalid-multipart", "Invalid multipart body",
                             "a text field holds a number no JSON reader takes");
    if (je < 0) {
        snprintf(detail, sizeof(detail), "%s at byte %zu", jerr.what, jerr.offset);
        return raise_problem(in, 400, "invalid-json", "Invalid JSON body", detail);
    }
    if (p->stream_format && !in->mp_canon)
        in->dv = (struct reply_delivery){.format = p->stream_format,
                                         .stream = sse_requested(in->body.sent, in->body.sent_len)};
    if (in->body.placeable != INJECT_OK) {
        snprintf(detail, sizeof(detail),
                 "this provider needs the gateway's reference at \"%s\" in a JSON object body; "
                 "remove that member or send an object there",
                 p->client_ref_body_field);
        return raise_problem(in, 422, "client-ref-unplaceable", "Client reference cannot be placed",
                             detail);
    }
    return STEP_NEXT;
}

/* fingerprint: provider, route and canonical body; and the id a new job will get. */
static enum step_result step_fingerprint(struct intake *in)
{
    fp_compute(in->p->name, strlen(in->p->name), in->rt->route, strlen(in->rt->route),
               in->mp_canon ? in->mp_canon : in->body.canon,
               in->mp_canon ? in->mp_canon_len : in->body.canon_len, in->fp);
    if (crypto_job_id(in->job_id) < 0 || !in->fp[0])
        return raise_problem(in, 500, "internal", "Internal error", "no randomness");
    return STEP_NEXT;
}

/* gate: the tenant gate every creation passes (gate.h): its requests per second, and the price
 * the record reserves against its budget (whose verdict the store takes in the same commit).
 * Replays pass it too, as they did the rate limit before: a client retrying in a loop is slowed
 * whether or not its key exists. Over the rate nothing is recorded. */
static enum step_result step_gate(struct intake *in)
{
    struct gate_req q = {.token_hash = in->token,
                         .p = in->p,
                         .body = in->body.sent,
                         .len = in->body.sent_len,
                         .outputs = in->body.requested};
    int retry_after = gate_admit(in->r, &q, &in->pass);
    if (!retry_after)
        return STEP_NEXT;
    gate_reply_rate(in->r, retry_after);
    return STEP_ANSWERED;
}

/* cache: a terminal job never changes, so a replay of it needs no database round trip. */
static enum step_result step_cache(struct intake *in)
{
    struct jobcache_entry hit;
    if (!jobcache_get('k', in->token, in->key, &hit))
        return STEP_NEXT;
    int same = strcmp(hit.fingerprint, in->fp) == 0;
    if (same && in->wait_s > 0)
        reply_result(in->r, &hit, 1, in->wait_s, &in->dv);
    else if (same)
        reply_entry(in->r, 202, &hit, 1, 1);
    enum step_result res = same ? STEP_ANSWERED : raise_key_reused(in, hit.job_id, hit.provider,
                                                                    hit.route);
    jobcache_entry_fini(&hit);
    if (!same)
        return res;
    return STEP_ANSWERED;
}

/* On a database worker (the store blocks: disk or bucket): the upload's large parts published,
 * then the request goes on to be recorded. A store that does not take them costs no request:
 * the row keeps the upload whole, as it would without a store, and the event says why. */
static void stage_upload(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    struct intake *in = api_ctx(r);
    char why[256] = "";
    int published = 0;
    double t0 = clock_mono();
    int rc = ups_stage(in->cfg, in->mp_raw, in->mp_raw_len, in->mp_parts, in->mp_n,
                       &in->mp_stored, &in->mp_stored_len, &published, why, sizeof(why));
    if (rc < 0)
        LOG(LOG_WARN, "upload_kept_in_row", LS("provider", in->p->name), LS("error", why),
            LI("bytes", (long long)in->mp_raw_len),
            LS("note", "the archive store did not take the upload's large parts: the row keeps "
                       "the whole upload"));
    else
        LOG(LOG_DEBUG, "upload_parts_stored", LS("provider", in->p->name),
            LI("published", published), LI("bytes", (long long)in->mp_raw_len),
            LI("row_bytes", (long long)in->mp_stored_len),
            LI("ms", (long long)((clock_mono() - t0) * 1000)));
    api_set_continuation(r, intake_continue);
}

/* stage: an upload with parts longer than upload_part_inline_bytes has them published to the
 * archive store, by their SHA-256, before the intent that names them is committed (the row
 * never refers to an object that is not durable). A replay publishes the same objects again: a
 * no-op. The fingerprint is not touched: it was made from each part's SHA-256 already. */
static enum step_result step_stage(struct intake *in)
{
    unsigned char sel[MP_MAX_PARTS];
    if (!in->mp_parts || in->mp_n > MP_MAX_PARTS ||
        !upl_select(in->mp_parts, in->mp_n, in->cfg->upload_part_inline_bytes, sel))
        return STEP_NEXT;
    if (api_offload(in->r, stage_upload, NULL) < 0) {
        reply_shutting_down(in->r); /* the database workers have stopped */
        return STEP_ANSWERED;
    }
    return STEP_SUSPENDED;
}

static void wait_suspended(struct hs_req *r, const struct store_job *j, int replayed, int wait_s,
                           const char *token, int local);

/* The intake's log line for the job it answers (a prefix of the key's hash names the key). */
static void log_answer(const struct intake *in, const struct store_job *j, const char *event)
{
    char key_hash[CRYPTO_SHA256_HEX];
    crypto_sha256_hex(in->key, strlen(in->key), key_hash);
    key_hash[16] = '\0'; /* a prefix identifies the key in logs without revealing it */
    LOG(LOG_INFO, event, LS("job_id", j->id), LS("key_hash", key_hash),
        LS("provider", in->p->name), LS("state", st_name(j->state)),
        LS("request_id", hs_req_id(in->r)));
}

/* The common case of a wait, decided where the commit returned: a new job, born reserved for
 * this replica's dispatcher, whose client waits for it without a stream. Its request stays
 * suspended and waits from here (what step_recorded and step_answer would do once a server
 * thread was woken for it, only to suspend it again at once): one resumption per request, by
 * the job's end. Anything else (a refusal, an error, a key taken, a stream, a drain) returns 0
 * and the steps go on, on a server thread. */
static int wait_from_commit(struct intake *in)
{
    struct store_intake_item *si = &in->rec.in;
    if (si->err != STORE_OK || !si->created || in->wait_s <= 0 || in->ls ||
        si->job.state != ST_PREPARED || si->job.lease_version != 1 || hs_req_draining(in->r))
        return 0;
    in->job = si->job;
    memset(&si->job, 0, sizeof(si->job));
    in->created = 1;
    in->have_job = 1;
    in->next_step = SIZE_MAX; /* no step left: its waiter resumes it into intake_resume */
    log_answer(in, &in->job, "intake_new");
    in->wait_deadline = waiters_now() + in->wait_s;
    wait_suspended(in->r, &in->job, 0, in->wait_s, in->token, 1);
    return 1;
}

/* The recorder's callback, on a writer thread: the commit holding the intent returned. */
static void intake_recorded(struct rec_item *it)
{
    struct intake *in = (struct intake *)((char *)it - offsetof(struct intake, rec));
    struct hs_req *r = in->r;
    CRASH_POINT("after_intent_commit");
    /* Handed to the dispatcher: the attempt closes the live stream it feeds, whatever becomes
     * of this request (a connection reset while the commit ran ends it before step_recorded,
     * and its live stream must go on recording). */
    if (it->handed_over)
        in->ls_new = 0;
    atomic_store_explicit(&in->recorded, 1, memory_order_release);
    if (!wait_from_commit(in))
        hs_resume(r);
}

/* The recorder is closed (shutting down): the intent is recorded alone, on a database worker. */
static void record_alone(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    struct intake *in = api_ctx(r);
    struct store_intake_item *si = &in->rec.in;
    CRASH_POINT("before_intent_commit");
    si->err = store_intake(api_db(r), &si->q, &si->job, &si->created);
    CRASH_POINT("after_intent_commit");
    if (si->err == STORE_OK && si->created)
        wake_work(); /* for any replica: this one is stopping */
    atomic_store_explicit(&in->recorded, 1, memory_order_release);
}

/* record: the intent, committed in a group commit; or the job that already holds the key. The
 * server thread does not wait: the request is suspended until the recorder's commit returned
 * (when the recorder is closed, at shutdown, a database worker records the intent alone). */
static enum step_result step_record(struct intake *in)
{
    const struct cfg_provider *p = in->p;
    if (asprintf(&in->url, "%s%s", p->base_url, in->rt->path) < 0) {
        in->url = NULL;
        return raise_problem(in, 500, "internal", "Internal error", "out of memory");
    }
    in->rec.in.q = (struct store_intake_req){.tenant_id = in->tenant.id,
                                             .idempotency_key = in->key,
                                             .new_id = in->job_id,
                                             .fingerprint_hex = in->fp,
                                             .fingerprint_version = FP_VERSION,
                                             .provider = p->name,
                                             .route = in->rt->route,
                                             .method = in->rt->method,
                                             .url = in->url,
                                             .credential = p->credential ? p->credential : "",
                                             .body = in->mp_stored ? in->mp_stored
                                                     : in->mp_raw  ? in->mp_raw
                                                                   : in->body.sent,
                                             .body_len = in->mp_stored ? in->mp_stored_len
                                                         : in->mp_raw  ? in->mp_raw_len
                                                                       : in->body.sent_len,
                                             .ttl_hours = in->cfg->job_ttl_hours,
                                             .idem_header = p->idem_header,
                                             .reconcile_strategy =
                                                 prof_reconcile_name(p->reconcile),
                                             .outputs_requested = in->body.requested,
                                             .profile_id = p->profile_stamp,
                                             .reserve_micros = in->pass.reserve_micros,
                                             .currency = in->pass.currency,
                                             .unpriced = in->pass.unpriced};
    double now = clock_wall();
    long long sec = (long long)now;
    long usec = (long)((now - (double)sec) * 1e6);
    store_stamp(sec, usec, in->rec.in.q.at);
    store_stamp(sec + (long long)in->cfg->job_ttl_hours * 3600, usec, in->rec.in.q.expires_at);
    in->rec.done = intake_recorded;
    /* A stream its client waits for: opened before the intent is recorded, so that the call
     * (which may start as soon as the commit returns) finds it and feeds it from its first
     * event. */
    if (in->dv.stream && in->wait_s > 0 && !hs_req_http10(in->r)) /* streamed, and chunked */
        in->ls_new =
            (in->ls = ls_open(in->job_id, p->max_response_bytes, p->stream_format)) != NULL;
    /* Suspend before queueing, so that the resumption can never precede the suspension. */
    api_set_continuation(in->r, intake_continue);
    hs_suspend(in->r);
    if (recorder_submit(api_recorder(in->r), &in->rec) < 0 &&
        api_offload(in->r, record_alone, NULL) < 0) {
        in->rec.in.err = STORE_EUNAVAIL; /* shutting down: nothing recorded, a 503 */
        intake_recorded(&in->rec);
    }
    return STEP_SUSPENDED;
}

/* A key whose job ended and was deleted by retention (its tombstone, j): another request under it
 * is the key reused (422); the same one is told its job is gone (410) — never a new job, which
 * would be a second paid create for a request already made. */
static enum step_result key_gone(struct intake *in, struct store_job *j)
{
    enum step_result res;
    if (strcmp(j->fingerprint_hex, in->fp) != 0) {
        res = raise_key_reused(in, j->id, j->provider, j->route);
    } else {
        char detail[400];
        snprintf(detail, sizeof(detail),
                 "this key's request was job %s, which ended %s and was retired by retention at "
                 "%s (deleted since); nothing was sent again. A new generation needs a new "
                 "Idempotency-Key",
                 j->id, st_name(j->state), j->finished_at ? j->finished_at : "?");
        res = raise_problem(in, 410, "idempotency-key-expired", "Idempotency key expired",
                            detail);
    }
    log_answer(in, j, "intake_key_gone");
    store_job_fini(j);
    return res;
}

/* recorded: the recorder's answer. */
static enum step_result step_recorded(struct intake *in)
{
    struct store_intake_item *si = &in->rec.in;
    if (!atomic_load_explicit(&in->recorded, memory_order_acquire)) {
        /* Resumed before the recorder was done: only a bug could do that. */
        reply_store_error(in->r, STORE_EINTERNAL);
        return STEP_ANSWERED;
    }
    if (gate_refused(si->err)) {
        gate_reply_refused(in->r, si->err, si->q.reserve_micros, si->q.currency);
        return STEP_ANSWERED;
    }
    if (si->err == STORE_EGONE)
        return key_gone(in, &si->job);
    if (si->err < 0) {
        reply_store_error(in->r, si->err);
        return STEP_ANSWERED;
    }
    in->job = si->job;
    memset(&si->job, 0, sizeof(si->job));
    in->created = si->created;
    in->have_job = 1;
    return STEP_NEXT;
}

static void intake_stream_resume(struct hs_req *r);

/* A request whose intent is recorded (or whose key's job was found) reads its body no more:
 * the client's bytes — counted against the bound every tenant's requests share
 * (max_buffered_body_bytes): one tenant's waits of a minute held theirs to the end, and every
 * other tenant's POST was answered 503 meanwhile — and the intake's copies of them. */
static void drop_bodies(struct intake *in)
{
    if (!in)
        return;
    reqbody_fini(&in->body);
    free(in->mp_canon);
    free(in->mp_parts);
    free(in->mp_stored);
    in->mp_canon = in->mp_stored = NULL;
    in->mp_parts = NULL;
    in->mp_raw = NULL; /* it pointed into the client's bytes */
    in->mp_canon_len = in->mp_stored_len = in->mp_raw_len = 0;
    in->mp_n = 0;
    hs_req_drop_body(in->r);
}

/* The wait r's answers name (Preference-Applied): the one its client asked for, whatever is
 * left of it when a streamed request that never began waits on (wait_s, the time left). */
static int applied_wait(struct hs_req *r, int wait_s)
{
    const struct intake *in = api_ctx(r);
    return in && in->wait_s > 0 ? in->wait_s : wait_s;
}

/* The suspended request r waits for job j: resumed by its end, or when the wait is over, and
 * then answered by intake_resume. Its body is let go of while it waits. */
static void wait_suspended(struct hs_req *r, const struct store_job *j, int replayed, int wait_s,
                           const char *token, int local)
{
    drop_bodies(api_ctx(r));
    struct api_wait *w = api_wait(r);
    snprintf(w->job_id, sizeof(w->job_id), "%s", j->id);
    snprintf(w->token_hash, sizeof(w->token_hash), "%s", token);
    w->tenant_id = j->tenant_id;
    w->replayed = replayed;
    w->wait_seconds = applied_wait(r, wait_s);
    api_set_continuation(r, intake_resume);
    double deadline = waiters_now() + wait_s;
    struct waiters *ws = api_waiters(r);
    if ((local ? waiters_add_local : waiters_add)(ws, j->id, deadline, hs_resume, r) < 0)
        hs_resume(r); /* cannot wait: answer on resumption with the current state */
}

/* Answers a job: at once, or, with `Prefer: wait`, once it is terminal or the wait is over; a
 * streamed job with a live stream here (ls), as its events arrive. */
static void answer_or_wait(struct hs_req *r, struct store_job *j, int replayed, int wait_s,
                           const char *token, int local, struct ls *ls)
{
    if (wait_s > 0 && st_is_terminal(j->state)) {
        reply_provider_result(r, j, replayed, applied_wait(r, wait_s), delivery_of(r));
        return;
    }
    if (wait_s <= 0) {
        reply_job(r, 202, j, replayed, 1);
        return;
    }
    if (ls && !hs_req_draining(r)) {
        /* Until the stream begins (or the attempt ends without it): parked on the stream, its
         * body let go of as a wait's. */
        drop_bodies(api_ctx(r));
        api_set_continuation(r, intake_stream_resume);
        int parked = ls_park(ls, r, 0, waiters_now() + wait_s);
        if (parked == 0)
            intake_stream_resume(r);
        if (parked >= 0)
            return;
    }
    /* Suspend before registering, so that a wake-up can never precede the suspension. */
    hs_suspend(r);
    wait_suspended(r, j, replayed, wait_s, token, local);
}

/* A replay of a completed job, on a database worker: with its archive (the gateway's copies of
 * its outputs), as a read by id shows it; answered without it when it cannot be read. */
static void answer_completed_replay(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    struct intake *in = api_ctx(r);
    struct store_job *j = &in->job;
    if (archive_job_outputs(api_db(r), j->tenant_id, j->id, &j->archive, &j->archive_settled) < 0)
        j->archive = NULL;
    reply_cache_terminal(in->token, j);
    answer_or_wait(r, j, 1, in->wait_s, in->token, 0, NULL);
}

/* answer: 422 when the key holds another operation; else the job, new or replayed. */
static enum step_result step_answer(struct intake *in)
{
    struct store_job *j = &in->job;
    if (!in->created && strcmp(j->fingerprint_hex, in->fp) != 0) {
        log_answer(in, j, "intake_mismatch");
        return raise_key_reused(in, j->id, j->provider, j->route);
    }
    log_answer(in, j, in->created ? "intake_new" : "intake_replay");
    /* A completed job read from the database holds no archive: a client retrying its POST for
     * its result gets the gateway's copies as a read by id would (and the cache never keeps the
     * view without them). */
    int read_archive = !in->created && j->state == ST_COMPLETED && !j->archive;
    if (!read_archive)
        reply_cache_terminal(in->token, j);
    /* A row born reserved was handed to this replica's own dispatcher. */
    int local = in->created && j->state == ST_PREPARED && j->lease_version == 1;
    if (in->ls && !local) {
        /* Not ours to send: the stream opened for a new job has nothing to follow — unless this
         * replica's dispatcher claimed the row first and feeds it already. */
        ls_close_unfed(in->job_id);
        ls_release(in->ls);
        in->ls = NULL;
    }
    in->ls_new = 0; /* handed to this replica's dispatcher (its attempt closes it), or closed */
    /* The same streamed request again while its stream is live here: it joins it. */
    if (!in->created && in->dv.stream && in->wait_s > 0 && !st_is_terminal(j->state) &&
        !hs_req_http10(in->r))
        in->ls = ls_find(j->id);
    if (read_archive) {
        if (api_offload(in->r, answer_completed_replay, NULL) == 0)
            return STEP_SUSPENDED;
        reply_cache_terminal(in->token, j); /* stopping: answered without it */
    }
    in->wait_deadline = waiters_now() + in->wait_s;
    answer_or_wait(in->r, j, !in->created, in->wait_s, in->token, local, in->ls);
    return STEP_ANSWERED;
}

static const struct intake_step {
    const char *name;
    enum step_result (*run)(struct intake *in);
} steps[] = {
    {"authenticate", step_authenticate},
    {"validate", step_validate},
    {"limit", step_limit},
    {"canonicalise", step_canonicalise},
    {"fingerprint", step_fingerprint},
    {"gate", step_gate},
    {"cache", step_cache},
    {"stage", step_stage},
    {"record", step_record},
    {"recorded", step_recorded},
    {"answer", step_answer},
};
#define N_STEPS (sizeof(steps) / sizeof(steps[0]))

const char *intake_step_name(size_t i)
{
    return i < N_STEPS ? steps[i].name : NULL;
}

static void intake_free(void *arg)
{
    struct intake *in = arg;
    /* Opened, and not handed over: refused, not recorded, or recorded for any replica (this
     * one's dispatcher may feed it already: then its attempt ends it). */
    if (in->ls_new)
        ls_close_unfed(in->job_id);
    if (in->ls) {
        ls_unpark(in->ls, in->r);
        ls_release(in->ls);
    }
    if (in->wait_counted)
        limits_wait_end(in->token);
    reqbody_fini(&in->body);
    free(in->mp_canon);
    free(in->mp_parts);
    free(in->mp_stored);
    free(in->url);
    if (in->have_job)
        store_job_fini(&in->job);
    store_job_fini(&in->rec.in.job); /* set only when the answer never reached step_recorded */
    free(in);
}

/* Runs the steps from in->next_step until one answers or suspends. The answer step always
 * answers: running off the end is a bug, which hs_options.reject turns into a 500 rather than a
 * hanging client. */
static void run_steps(struct intake *in)
{
    while (in->next_step < N_STEPS) {
        enum step_result rc = steps[in->next_step++].run(in);
        if (rc == STEP_PROBLEM)
            answer_problem(in);
        if (rc != STEP_NEXT)
            return;
    }
}

static void intake_continue(struct hs_req *r)
{
    run_steps(api_ctx(r));
}

void intake_handle(struct hs_req *r, const struct api_args *a)
{
    struct intake *in = calloc(1, sizeof(*in));
    if (!in) {
        reply_store_error(r, STORE_EINTERNAL);
        return;
    }
    in->r = r;
    in->cfg = api_cfg(r);
    api_set_ctx(r, in, intake_free);
    in->target = a->tail ? a->tail : ""; /* points into the path, which lives as long */
    run_steps(in);
}

/* The waiting client's answer, on a database worker: the job as it is now — unless its token
 * was revoked while it waited (401, as any request of that token answers within the tenants'
 * bound: a hold of up to max_wait_seconds is no way around a revocation). */
static void answer_waited(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    struct api_wait *w = api_wait(r);
    struct tenant t;
    int e = tenants_get(api_db(r), w->token_hash, &t);
    if (e == STORE_OK && t.id != w->tenant_id)
        e = STORE_EAUTH; /* never: a token's tenant does not change */
    if (e != STORE_OK) {
        metrics_wait_answer(0);
        if (e == STORE_EAUTH)
            reply_unauthorized(r);
        else
            reply_job_error(r, e);
        return;
    }
    /* Confirmed: the answer this replica's commit left in memory, if there is one. */
    struct jobcache_entry ce;
    if (answers_get(w->job_id, &ce)) {
        metrics_wait_answer(1);
        reply_result(r, &ce, w->replayed, w->wait_seconds, delivery_of(r));
        jobcache_entry_fini(&ce);
        return;
    }
    struct store_job j;
    e = store_job_get(api_db(r), w->tenant_id, w->job_id, &j);
    metrics_wait_answer(0);
    if (e == STORE_OK) {
        if (st_is_terminal(j.state))
            reply_provider_result(r, &j, w->replayed, w->wait_seconds, delivery_of(r));
        else
            reply_job(r, 202, &j, w->replayed, 1);
        store_job_fini(&j);
    } else {
        /* STORE_ENOTFOUND: the job expired while the client waited — 404, as a read of it
         * would answer (a 401 told the client its token was refused). */
        reply_job_error(r, e);
    }
}

void intake_resume(struct hs_req *r)
{
    struct intake *in = api_ctx(r);
    if (in && in->wait_counted) { /* the hold is over: the slot is free before the answer goes */
        limits_wait_end(in->token);
        in->wait_counted = 0;
    }
    /* Woken by this replica's commit of the job's end: the answer is in memory (answers.h),
     * given from memory only while memory confirms the token (a revoked one is refused; one
     * memory cannot tell is asked of the database, with the job). */
    struct api_wait *w = api_wait(r);
    struct tenant t;
    int known = tenants_lookup(w->token_hash, &t);
    if (known < 0 || (known > 0 && t.id != w->tenant_id)) {
        metrics_wait_answer(0);
        reply_unauthorized(r);
        return;
    }
    struct jobcache_entry e;
    if (known > 0 && answers_get(w->job_id, &e)) {
        metrics_wait_answer(1);
        reply_result(r, &e, w->replayed, w->wait_seconds, delivery_of(r));
        jobcache_entry_fini(&e);
        return;
    }
    if (api_offload(r, answer_waited, NULL) < 0)
        reply_shutting_down(r); /* the database workers have stopped */
}

/* The live stream's reader, behind the streamed response: what arrived, then parked until more
 * does; its end whole, or a cut (the connection closes without the body's end, so the client
 * knows; a retry with the same key replays the record). */
static long read_live(void *arg, struct hs_req *r, unsigned long long pos, char *buf, size_t max)
{
    struct ls *ls = arg;
    for (;;) {
        size_t n = 0;
        switch (ls_read(ls, (size_t)pos, buf, max, &n)) {
        case LS_BYTES:
            return (long)n;
        case LS_END:
            return -1;
        case LS_CUT:
        case LS_NONE:
            return -2;
        case LS_WAIT:
            break;
        }
        if (hs_req_draining(r) || hs_req_gone(r))
            return -2; /* stopping, or its client left: the recording goes on (a retry by key
                        * replays it) */
        int parked = ls_park(ls, r, (size_t)pos, 0);
        if (parked != 0)
            return parked > 0 ? 0 : -2;
    }
}

static void release_live(void *arg)
{
    ls_release(arg);
}

/* A parked streamed request whose token is no live tenant's any more (revoked while it waited
 * for the stream to begin): 401, as a held answer's (intake_resume). */
static void refuse_stream(struct hs_req *r)
{
    struct intake *in = api_ctx(r);
    struct ls *ls = in->ls;
    in->ls = NULL;
    ls_unpark(ls, r);
    ls_release(ls);
    reply_unauthorized(r);
}

/* The parked streamed request's answer, its token confirmed: the stream once it shows, else the
 * job when the wait is over or the attempt ended without a stream. */
static void stream_answer(struct hs_req *r)
{
    struct intake *in = api_ctx(r);
    if (ls_shown(in->ls)) {
        char loc[64];
        snprintf(loc, sizeof(loc), "/v1/jobs/%s", in->job.id);
        const char *hdrs[] = {"Location",
                              loc,
                              "X-Idemgate-Job-Id",
                              in->job.id,
                              in->created ? NULL : "Idempotent-Replayed",
                              "true",
                              NULL};
        ls_hold(in->ls); /* the response's own reference */
        if (hs_respond_stream(r, 200, "text/event-stream", hdrs, read_live, in->ls,
                              release_live) < 0)
            reply_store_error(r, STORE_EINTERNAL);
        return;
    }
    struct ls *ls = in->ls;
    in->ls = NULL;
    ls_unpark(ls, r);
    ls_release(ls);
    double left = in->wait_deadline - waiters_now();
    if (left >= 1) {
        answer_or_wait(r, &in->job, !in->created, (int)left, in->token, 0, NULL);
        return;
    }
    /* The wait is over (the stream never began): answered now, as any wait at its end — not a
     * second later, and saying the wait the client asked for. */
    struct api_wait *w = api_wait(r);
    snprintf(w->job_id, sizeof(w->job_id), "%s", in->job.id);
    snprintf(w->token_hash, sizeof(w->token_hash), "%s", in->token);
    w->tenant_id = in->job.tenant_id;
    w->replayed = !in->created;
    w->wait_seconds = in->wait_s;
    intake_resume(r);
}

/* On a database worker: the token of a parked streamed request that memory could not confirm
 * (the tenants' directory not refreshed within its bound). A database that cannot tell leaves
 * it as it was proven at intake. */
static void stream_token_checked(struct hs_req *r, const struct api_args *a)
{
    (void)a;
    struct intake *in = api_ctx(r);
    struct tenant t;
    int e = tenants_get(api_db(r), in->token, &t);
    if (e == STORE_EAUTH || (e == STORE_OK && t.id != in->job.tenant_id))
        refuse_stream(r);
    else
        api_set_continuation(r, stream_answer); /* on the server's thread: a stream's answer */
}

/* A streamed job's waiting client, resumed by its live stream: the provider's events from the
 * first, as they arrive; or, when no stream began (the attempt was refused and will be tried
 * again, here or elsewhere), the job awaited as any other, for what is left of the wait — its
 * token confirmed first. */
static void intake_stream_resume(struct hs_req *r)
{
    struct intake *in = api_ctx(r);
    struct tenant t;
    int known = tenants_lookup(in->token, &t);
    if (known < 0 || (known > 0 && t.id != in->job.tenant_id)) {
        refuse_stream(r);
        return;
    }
    if (known == 0 && api_offload(r, stream_token_checked, NULL) == 0)
        return;
    stream_answer(r);
}
