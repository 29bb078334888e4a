#include "idemgate/intake.h"

#include "idemgate/api.h"
#include "idemgate/attempt.h"
#include "idemgate/crash.h"
#include "idemgate/crypto.h"
#include "idemgate/fingerprint.h"
#include "idemgate/headers.h"
#include "idemgate/inject.h"
#include "idemgate/jcs.h"
#include "idemgate/jobcache.h"
#include "idemgate/log.h"
#include "idemgate/provider.h"
#include "idemgate/reply.h"
#include "idemgate/store.h"
#include "idemgate/wake.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A problem a step raised; answered by the gate (raise_problem → answer_problem). */
struct intake_problem {
    int status;
    const char *type, *title;
    char detail[256];
    int key_reused; /* the 422 of reply_key_reused() */
};

/* The body as the later steps need it, from the client's bytes. */
struct intake_body {
    char *canon; /* RFC 8785 form: what is fingerprinted */
    size_t canon_len;
    char *sent; /* the client's bytes, compacted: what is stored and sent */
    size_t sent_len;
    int requested; /* outputs asked for, or -1 when the provider's outputs are not counted */
};

/* One intake request on its way through the steps. */
struct intake {
    struct hs_req *r;
    const struct cfg *cfg;
    const char *target; /* "{provider}/{route}" */
    char token[CRYPTO_SHA256_HEX];
    int tenant_proven; /* the store or the tenant's cache answered for the token */
    const struct cfg_provider *p;
    const struct cfg_route *rt;
    char key[HDR_KEY_MAX + 1];
    int wait_s;
    struct intake_body body;
    char fp[CRYPTO_SHA256_HEX];
    char job_id[CRYPTO_JOB_ID_LEN];
    struct store_job job;
    int have_job, created;
    struct intake_problem problem;
};

enum step_result { STEP_NEXT = 0, STEP_ANSWERED, STEP_PROBLEM };

static enum step_result raise_problem(struct intake *in, int status, const char *type,
                                      const char *title, const char *detail)
{
    in->problem.status = status;
    in->problem.type = type;
    in->problem.title = title;
    snprintf(in->problem.detail, sizeof(in->problem.detail), "%s", detail);
    return STEP_PROBLEM;
}

static enum step_result raise_key_reused(struct intake *in)
{
    in->problem.status = 422;
    in->problem.key_reused = 1;
    return STEP_PROBLEM;
}

int intake_needs_tenant(int status, int tenant_proven)
{
    return !tenant_proven && status >= 400 && status < 500 && status != 401 && status != 413;
}

/* The gate: no 4xx reaches a client not proven a tenant. */
static void answer_problem(struct intake *in)
{
    const struct intake_problem *pb = &in->problem;
    int gated = intake_needs_tenant(pb->status, in->tenant_proven);
    if (pb->key_reused)
        reply_key_reused(in->r, 0); /* only ever raised once the tenant is proven */
    else
        reply_tenant_problem(in->r, gated ? in->token : NULL, pb->status, pb->type, pb->title,
                             pb->detail);
}

/* authenticate: a well-formed bearer token, hashed. The store proves it a tenant's later, in the
 * same round trip as the intent (record), or the gate does before any 4xx. */
static enum step_result step_authenticate(struct intake *in)
{
    if (reply_token_hash(in->r, in->token) < 0) {
        reply_unauthorized(in->r);
        return STEP_ANSWERED;
    }
    return STEP_NEXT;
}

/* validate: the body's size, a declared provider route, one well-formed Idempotency-Key. */
static enum step_result step_validate(struct intake *in)
{
    char detail[96];
    if (hs_req_body_too_large(in->r)) {
        snprintf(detail, sizeof(detail), "the body exceeds %ld bytes", in->cfg->max_body_bytes);
        return raise_problem(in, 413, "payload-too-large", "Payload too large", detail);
    }
    const char *slash = strchr(in->target, '/');
    in->p = slash ? cfg_find_provider(in->cfg, in->target, (size_t)(slash - in->target)) : NULL;
    in->rt = in->p ? cfg_find_route(in->p, slash + 1, strlen(slash + 1)) : NULL;
    if (!in->rt)
        return raise_problem(in, 404, "unknown-route", "Unknown provider route",
                             "only routes declared in the gateway's configuration are forwarded");
    const char *raw_key = hs_req_header(in->r, "Idempotency-Key");
    if (!raw_key)
        return raise_problem(in, 400, "missing-idempotency-key", "Missing Idempotency-Key",
                             "send an Idempotency-Key header that identifies the intended output");
    if (hs_req_header_count(in->r, "Idempotency-Key") != 1 ||
        hdr_idempotency_key(raw_key, in->key) < 0)
        return raise_problem(in, 400, "invalid-idempotency-key", "Invalid Idempotency-Key",
                             "one key of 1 to 255 printable ASCII characters, bare or as an RFC "
                             "8941 quoted string");
    in->wait_s = hdr_prefer_wait(hs_req_header(in->r, "Prefer"), in->cfg->max_wait_seconds);
    return STEP_NEXT;
}

/* How many outputs the request asks for, when the provider's outputs are counted: the number at
 * the profile's path in the body, or its default. -1 when outputs are not counted. */
static int outputs_requested(const struct cfg_provider *p, const char *json, size_t len)
{
    if (!p->outputs_received)
        return -1;
    int n = p->outputs_default;
    if (p->outputs_requested) {
        cJSON *doc = cJSON_ParseWithLength(json, len);
        const cJSON *v = jpath_first(p->outputs_requested, doc);
        if (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 1000)
            n = (int)v->valuedouble;
        cJSON_Delete(doc);
    }
    return n;
}

/* canonicalise: the strict RFC 8785 form (the body is refused here when it is not unambiguous
 * JSON), then what the record needs from the client's own bytes: those bytes compacted (the
 * canonical form would round numbers beyond 2^53 on their way to the provider), whether the
 * client reference fits in them, and the outputs asked for. */
static enum step_result step_canonicalise(struct intake *in)
{
    struct intake_body *b = &in->body;
    struct jcs_error jerr;
    char detail[160];
    size_t len = 0;
    const char *raw = hs_req_body(in->r, &len);
    int je = jcs_canonicalize(raw, len, in->cfg->max_json_depth, &b->canon, &b->canon_len, &jerr);
    if (je == JCS_ENOMEM)
        return raise_problem(in, 500, "internal", "Internal error", "out of memory");
    if (je < 0) {
        snprintf(detail, sizeof(detail), "%s at byte %zu", jerr.what, jerr.offset);
        return raise_problem(in, 400, "invalid-json", "Invalid JSON body", detail);
    }
    if (inject_compact(raw, len, &b->sent, &b->sent_len) < 0)
        return raise_problem(in, 500, "internal", "Internal error", "out of memory");
    /* A create whose reconciliation finds the task by our client reference never leaves
     * without it: when the body leaves no place for it, the client learns it now. */
    const struct cfg_provider *p = in->p;
    if (p->client_ref_body_field && attempt_needs_client_ref(prof_reconcile_name(p->reconcile)) &&
        inject_check(b->sent, b->sent_len, p->client_ref_body_field) != INJECT_OK) {
        snprintf(detail, sizeof(detail),
                 "this provider needs the gateway's reference at \"%s\" in a JSON object body; "
                 "remove that member or send an object there",
                 p->client_ref_body_field);
        return raise_problem(in, 422, "client-ref-unplaceable", "Client reference cannot be placed",
                             detail);
    }
    b->requested = outputs_requested(p, b->sent, b->sent_len);
    return STEP_NEXT;
}

/* fingerprint: provider, route and canonical body; and the id a new job will get. */
static enum step_result step_fingerprint(struct intake *in)
{
    fp_compute(in->p->name, strlen(in->p->name), in->rt->route, strlen(in->rt->route),
               in->body.canon, in->body.canon_len, in->fp);
    if (crypto_job_id(in->job_id) < 0 || !in->fp[0])
        return raise_problem(in, 500, "internal", "Internal error", "no randomness");
    return STEP_NEXT;
}

/* cache: a terminal job never changes, so a replay of it needs no database round trip. */
static enum step_result step_cache(struct intake *in)
{
    struct jobcache_entry hit;
    if (!jobcache_get('k', in->token, in->key, &hit))
        return STEP_NEXT;
    in->tenant_proven = 1; /* the entry was stored under this token's hash */
    int same = strcmp(hit.fingerprint, in->fp) == 0;
    if (same && in->wait_s > 0)
        reply_result(in->r, &hit, 1, in->wait_s);
    else if (same)
        reply_entry(in->r, 202, &hit, 1, 1);
    jobcache_entry_fini(&hit);
    if (!same)
        return raise_key_reused(in);
    return STEP_ANSWERED;
}

/* record: the intent, committed in one round trip that also proves the token a tenant's; or the
 * job that already holds the key. */
static enum step_result step_record(struct intake *in)
{
    char url[2048];
    const struct cfg_provider *p = in->p;
    snprintf(url, sizeof(url), "%s%s", p->base_url, in->rt->path);
    struct store_intake_req q = {.token_sha256_hex = in->token,
                                 .idempotency_key = in->key,
                                 .new_id = in->job_id,
                                 .fingerprint_hex = in->fp,
                                 .fingerprint_version = FP_VERSION,
                                 .provider = p->name,
                                 .route = in->rt->route,
                                 .method = in->rt->method,
                                 .url = url,
                                 .credential = p->secret_env ? p->secret_env : "",
                                 .body = in->body.sent,
                                 .body_len = in->body.sent_len,
                                 .ttl_hours = in->cfg->job_ttl_hours,
                                 .idem_header = p->idem_header,
                                 .reconcile_strategy = prof_reconcile_name(p->reconcile),
                                 .outputs_requested = in->body.requested,
                                 .profile_id = p->profile_id};
    CRASH_POINT("before_intent_commit");
    int e = store_intake(api_db(in->r), &q, &in->job, &in->created);
    if (e == STORE_EAUTH) {
        reply_unauthorized(in->r);
        return STEP_ANSWERED;
    }
    if (e < 0) {
        reply_store_error(in->r, e);
        return STEP_ANSWERED;
    }
    in->have_job = 1;
    in->tenant_proven = 1;
    if (in->created)
        wake_work();
    CRASH_POINT("after_intent_commit");
    return STEP_NEXT;
}

/* Answers a job: at once, or, with `Prefer: wait`, once it is terminal or the wait is over. */
static void answer_or_wait(struct hs_req *r, struct store_job *j, int replayed, int wait_s,
                           const char *token)
{
    if (wait_s > 0 && st_is_terminal(j->state)) {
        reply_provider_result(r, j, replayed, wait_s);
        return;
    }
    if (wait_s <= 0) {
        reply_job(r, 202, j, replayed, 1);
        return;
    }
    struct api_wait *w = api_wait(r);
    snprintf(w->job_id, sizeof(w->job_id), "%s", j->id);
    snprintf(w->token_hash, sizeof(w->token_hash), "%s", token);
    w->replayed = replayed;
    w->wait_seconds = wait_s;
    w->active = 1;
    /* Suspend before registering, so that a wake-up can never precede the suspension. */
    hs_suspend(r);
    if (waiters_add(api_waiters(r), j->id, waiters_now() + wait_s, hs_resume, r) < 0)
        hs_resume(r); /* cannot wait: answer on resumption with the current state */
}

/* answer: 422 when the key holds another operation; else the job, new or replayed. */
static enum step_result step_answer(struct intake *in)
{
    char key_hash[CRYPTO_SHA256_HEX];
    struct store_job *j = &in->job;
    crypto_sha256_hex(in->key, strlen(in->key), key_hash);
    key_hash[16] = '\0'; /* a prefix identifies the key in logs without revealing it */
    if (!in->created && strcmp(j->fingerprint_hex, in->fp) != 0) {
        LOG(LOG_INFO, "intake_mismatch", LS("job_id", j->id), LS("key_hash", key_hash),
            LS("provider", in->p->name), LS("request_id", hs_req_id(in->r)));
        return raise_key_reused(in);
    }
    LOG(LOG_INFO, in->created ? "intake_new" : "intake_replay", LS("job_id", j->id),
        LS("key_hash", key_hash), LS("provider", in->p->name), LS("state", st_name(j->state)),
        LS("request_id", hs_req_id(in->r)));
    reply_cache_terminal(in->token, j);
    answer_or_wait(in->r, j, !in->created, in->wait_s, in->token);
    return STEP_ANSWERED;
}

static const struct intake_step {
    const char *name;
    enum step_result (*run)(struct intake *in);
} steps[] = {
    {"authenticate", step_authenticate},
    {"validate", step_validate},
    {"canonicalise", step_canonicalise},
    {"fingerprint", step_fingerprint},
    {"cache", step_cache},
    {"record", step_record},
    {"answer", step_answer},
};
#define N_STEPS (sizeof(steps) / sizeof(steps[0]))

const char *intake_step_name(size_t i)
{
    return i < N_STEPS ? steps[i].name : NULL;
}

void intake_handle(struct hs_req *r, const struct api_args *a)
{
    struct intake in = {.r = r, .cfg = api_cfg(r), .target = a->tail ? a->tail : ""};
    in.body.requested = -1;
    for (size_t i = 0; i < N_STEPS; i++) {
        enum step_result rc = steps[i].run(&in);
        if (rc == STEP_PROBLEM)
            answer_problem(&in);
        if (rc != STEP_NEXT)
            goto done;
    }
    /* The answer step always answers: reaching here is a bug, which hs_options.reject turns
     * into a 500 rather than a hanging client. */
done:
    free(in.body.canon);
    free(in.body.sent);
    if (in.have_job)
        store_job_fini(&in.job);
}

void intake_resume(struct hs_req *r)
{
    struct api_wait *w = api_wait(r);
    struct store_job j;
    int e = store_job_get(api_db(r), w->token_hash, w->job_id, &j);
    if (e == STORE_OK) {
        if (st_is_terminal(j.state))
            reply_provider_result(r, &j, w->replayed, w->wait_seconds);
        else
            reply_job(r, 202, &j, w->replayed, 1);
        store_job_fini(&j);
    } else if (e == STORE_ENOTFOUND || e == STORE_EAUTH) {
        /* The tenant was revoked or the job expired while the client waited. */
        reply_unauthorized(r);
    } else {
        reply_store_error(r, e);
    }
}
