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

/* Whether the delivery's signature verifies under the provider's scheme: 0 or -1. A signed
 * timestamp is judged by the database's clock; when it cannot be read, -1 and *store_err holds
 * the store error (the delivery is neither accepted nor refused). */
static int verify(struct hs_req *r, const struct cfg_provider *p, const char *body, size_t len,
                  int *store_err)
{
    const char *secret = p->webhook_secret_env ? getenv(p->webhook_secret_env) : NULL;
    long long now = 0;
    *store_err = 0;
    switch (p->webhook_verify) {
    case WHV_STANDARD_WEBHOOKS:
        if ((*store_err = store_db_now(api_db(r), &now)) < 0)
            return -1;
        return wh_verify_standard(req_header, r, body, len, secret, now);
    case WHV_HMAC_SHA256_HEX:
        return wh_verify_hmac_hex(req_header, r, p->webhook_signature_header, body, len, secret);
    case WHV_ED25519:
        if ((*store_err = store_db_now(api_db(r), &now)) < 0)
            return -1;
        return wh_verify_ed25519(req_header, r, body, len, secret, now);
    case WHV_NONE:
        return 0;
    }
    return -1;
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
    CRASH_POINT("webhook_before_dedupe");
    struct store_webhook_req wr = {.provider = p->name,
                                   .event_id = d->event,
                                   .remote_id = d->task,
                                   .window_hours = p->webhook_window_hours,
                                   .is_signed = p->webhook_verify != WHV_NONE,
                                   .client_ref = *d->client_ref ? d->client_ref : NULL};
    int e = store_webhook(api_db(r), &wr, &fresh, &hinted, &parked);
    CRASH_POINT("webhook_after_dedupe");
    if (e < 0) {
        reply_store_error(r, e);
        return;
    }
    if (!fresh)
        metrics_safety(MS_WEBHOOK_DUPLICATE);
    LOG(LOG_INFO, "webhook", LS("provider", p->name), LS("remote_id", d->task),
        LI("duplicate", !fresh), LI("hinted", hinted), LI("parked", parked));
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
