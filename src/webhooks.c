#include "idemgate/webhooks.h"

#include "idemgate/api.h"
#include "idemgate/crash.h"
#include "idemgate/crypto.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/provider.h"
#include "idemgate/reply.h"
#include "idemgate/store.h"
#include "idemgate/whverify.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *req_header(const char *name, void *arg)
{
    return hs_req_header(arg, name);
}

/* The database's clock, read for a delivery whose signature verified (wh_clock_fn). */
struct db_clock {
    struct hs_req *r;
    int err;
};

static int db_clock(void *ctx, long long *now)
{
    struct db_clock *c = ctx;
    return (c->err = store_db_now(api_db(c->r), now)) < 0 ? -1 : 0;
}

/* Whether the delivery's signature verifies under the provider's scheme: 0 or -1. A signed
 * timestamp is judged by the database's clock, read only once the signature verified (a
 * delivery nobody signed costs no round trip to the database); when it cannot be read, -1 and
 * *store_err holds the store error (the delivery is neither accepted nor refused). */
static int verify(struct hs_req *r, const struct cfg_provider *p, const char *body, size_t len,
                  int *store_err)
{
    const char *secret = p->webhook_secret_env ? getenv(p->webhook_secret_env) : NULL;
    struct db_clock c = {r, 0};
    int v = -1;
    switch (p->webhook_verify) {
    case WHV_STANDARD_WEBHOOKS:
        v = wh_verify_standard_at(req_header, r, body, len, secret, db_clock, &c);
        break;
    case WHV_HMAC_SHA256_HEX:
        v = wh_verify_hmac_hex(req_header, r, p->webhook_signature_header, body, len, secret);
        break;
    case WHV_ED25519:
        v = wh_verify_ed25519_at(req_header, r, body, len, secret, db_clock, &c);
        break;
    case WHV_NONE:
        v = 0;
        break;
    }
    *store_err = v == WH_ECLOCK ? c.err : 0;
    return v < 0 ? -1 : 0;
}

/* What a delivery says, copied out of its body and headers. */
struct delivery {
    char task[256], event[256], client_ref[256];
};

/* Ids are read exactly: a numeric task id above 2^53 is its digits, never a rounded double. Our
 * client reference counts only when the delivery is signed. Without an event id from the
 * provider, the delivery's own content identifies it. */
static void read_delivery(struct hs_req *r, const struct cfg_provider *p, const char *body,
                          size_t len, struct delivery *d)
{
    int is_signed = p->webhook_verify != WHV_NONE;
    cJSON *doc = prov_id_doc(body, len);
    const char *tid = doc ? prov_read_id(p->webhook_task_id, doc) : NULL;
    const char *ref =
        doc && is_signed && p->webhook_client_ref ? prov_read_id(p->webhook_client_ref, doc) : NULL;
    memset(d, 0, sizeof(*d));
    if (tid)
        snprintf(d->task, sizeof(d->task), "%s", tid);
    if (ref)
        snprintf(d->client_ref, sizeof(d->client_ref), "%s", ref);
    const char *eid = p->webhook_event_id_header   ? hs_req_header(r, p->webhook_event_id_header)
                      : p->webhook_event_id && doc ? jpath_string(p->webhook_event_id, doc)
                                                   : NULL;
    if (eid)
        snprintf(d->event, sizeof(d->event), "%s", eid);
    else
        crypto_sha256_hex(body, len, d->event);
    cJSON_Delete(doc);
}

/* Dedupes the event and hints the job; answers 200 (the provider stops redelivering) or a store
 * error (it redelivers). */
static void record_delivery(struct hs_req *r, const struct cfg_provider *p,
                            const struct delivery *d)
{
    int fresh = 0, hinted = 0, parked = 0;
    char late[64];
    CRASH_POINT("webhook_before_dedupe");
    struct store_webhook_req wr = {.provider = p->name,
                                   .event_id = d->event,
                                   .remote_id = d->task,
                                   .window_hours = p->webhook_window_hours,
                                   .is_signed = p->webhook_verify != WHV_NONE,
                                   .client_ref = *d->client_ref ? d->client_ref : NULL};
    int e = store_webhook(api_db(r), &wr, &fresh, &hinted, &parked, late, sizeof(late));
    CRASH_POINT("webhook_after_dedupe");
    if (e < 0) {
        reply_store_error(r, e);
        return;
    }
    if (!fresh)
        metrics_safety(MS_WEBHOOK_DUPLICATE);
    LOG(LOG_INFO, "webhook", LS("provider", p->name), LS("remote_id", d->task),
        LI("duplicate", !fresh), LI("hinted", hinted), LI("parked", parked));
    if (*late) {
        /* A task exists for a job that ended failed (no task, it said; or an operator abandoned
         * it): the state stays, and this line is the record of the task — an operator reads it
         * at the provider. */
        metrics_safety(MS_TASK_AFTER_FAILURE);
        LOG(LOG_ERROR, "task_after_failure", LS("job_id", late),
            LS("provider", p->name), LS("remote_id", d->task),
            LS("note", "a signed webhook names a task of a job that ended failed: it may be "
                       "paid; the job stays failed, read the task at the provider"));
    }
    char out[128];
    int n = snprintf(out, sizeof(out), "{\"received\":true,\"duplicate\":%s,\"parked\":%s}",
                     fresh ? "false" : "true", parked ? "true" : "false");
    hs_respond(r, 200, "application/json", out, (size_t)n, NULL);
}

void webhooks_receive(struct hs_req *r, const struct api_args *a)
{
    const char *provider = a->tail ? a->tail : "";
    const struct cfg_provider *p = cfg_find_provider(api_cfg(r), provider, strlen(provider));
    struct delivery d;
    size_t len = 0;
    if (!p || !p->webhook_task_id) {
        reply_problem(r, 404, "unknown-provider", "Unknown provider",
                      "no webhooks are configured for this provider", 0);
        return;
    }
    const char *body = hs_req_body(r, &len);
    int store_err;
    int v = verify(r, p, body, len, &store_err);
    if (store_err < 0) {
        reply_store_error(r, store_err); /* the provider redelivers */
        return;
    }
    if (v < 0) {
        metrics_safety(MS_WEBHOOK_REFUSED);
        LOG(LOG_WARN, "webhook_refused", LS("provider", provider), LS("request_id", hs_req_id(r)));
        reply_problem(r, 401, "bad-signature", "Webhook signature refused",
                      "the signature, secret or timestamp does not verify", 0);
        return;
    }
    read_delivery(r, p, body, len, &d);
    if (!*d.task) {
        reply_problem(r, 400, "invalid-webhook", "Webhook without a task id",
                      "the body has no task id where the profile says", 0);
        return;
    }
    record_delivery(r, p, &d);
}
