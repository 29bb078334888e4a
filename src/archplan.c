#include "idemgate/archplan.h"

#include "idemgate/backoff.h"
#include "idemgate/profile.h"
#include "idemgate/provider.h"

#include <stdlib.h>
#include <string.h>

#define DEFAULT_URL_TTL_S 3600
#define RETRY_BASE_MS 1000
#define RETRY_CAP_MS 60000

static const char *const kind_names[] = {"url", "b64", "endpoint"};

const char *ap_kind_name(enum ap_kind k)
{
    return (unsigned)k <= AP_ENDPOINT ? kind_names[k] : "url";
}

int ap_kind_parse(const char *s)
{
    for (int i = 0; s && i <= AP_ENDPOINT; i++)
        if (strcmp(s, kind_names[i]) == 0)
            return i;
    return -1;
}

void ap_plan_fini(struct ap_plan *pl)
{
    for (size_t i = 0; i < pl->n; i++) {
        free(pl->out[i].url);
        free(pl->out[i].content_type);
    }
    free(pl->out);
    cJSON_Delete(pl->doc);
    memset(pl, 0, sizeof(*pl));
}

struct walk {
    const struct cfg_provider *p;
    struct ap_plan *pl;
    size_t cap;
    double expires;
    int oom;
};

static struct ap_output *grow(struct walk *w)
{
    if (w->pl->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 4;
        struct ap_output *o = realloc(w->pl->out, cap * sizeof(*o));
        if (!o) {
            w->oom = 1;
            return NULL;
        }
        w->pl->out = o;
        w->cap = cap;
    }
    struct ap_output *o = &w->pl->out[w->pl->n++];
    memset(o, 0, sizeof(*o));
    return o;
}

/* One output: a string (a URL, or base64 when the result's kind says so) or an object holding a
 * URL or base64 data. An item with neither is not an output. */
static void add_item(const cJSON *node, void *arg)
{
    struct walk *w = arg;
    const struct cfg_provider *p = w->p;
    const struct arch_profile *ap = p->archive;
    const char *url = NULL, *b64 = NULL, *ct = NULL;
    int b64_kind = p->result_kind && strcmp(p->result_kind, "b64") == 0;
    if (cJSON_IsString(node)) {
        if (b64_kind)
            b64 = node->valuestring;
        else
            url = node->valuestring;
    } else if (cJSON_IsObject(node)) {
        const struct jpath *up = ap && ap->url ? ap->url : p->result_output_url;
        if (up)
            url = jpath_string(up, node);
        else
            url = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(node, "url"));
        if (!url && ap && ap->b64)
            b64 = jpath_string(ap->b64, node);
        if (ap && ap->content_type)
            ct = jpath_string(ap->content_type, node);
    }
    if (!url && !b64)
        return;
    struct ap_output *o = grow(w);
    if (!o)
        return;
    if (url) {
        o->kind = AP_URL;
        o->url = strdup(url);
        o->expires_at = w->expires;
    } else {
        o->kind = AP_B64;
        o->b64 = b64;
    }
    o->content_type = ct ? strdup(ct) : NULL;
    if ((url && !o->url) || (ct && !o->content_type))
        w->oom = 1;
}

static const char *var_id(const char *name, size_t len, void *arg)
{
    return len == 2 && memcmp(name, "id", 2) == 0 ? arg : NULL;
}

int ap_plan_outputs(const struct cfg_provider *p, const char *body, size_t len,
                    const char *outputs_json, const char *remote_id, double now, struct ap_plan *pl)
{
    (void)outputs_json;
    memset(pl, 0, sizeof(*pl));
    pl->doc = body && len ? cJSON_ParseWithLength(body, len) : NULL;
    long ttl = p->result_url_ttl_s > 0 ? p->result_url_ttl_s : DEFAULT_URL_TTL_S;
    struct walk w = {p, pl, 0, now + (double)ttl, 0};
    /* The provider's own expiry, when its answer gives one, beats the profile's lifetime. */
    const cJSON *exp =
        pl->doc && p->result_expires_at ? jpath_first(p->result_expires_at, pl->doc) : NULL;
    if (cJSON_IsNumber(exp) && exp->valuedouble > 0)
        w.expires = exp->valuedouble;
    if (p->result_kind && strcmp(p->result_kind, "binary_endpoint") == 0) {
        if (!remote_id || !p->result_content_path)
            return 0;
        struct ap_output *o = grow(&w);
        if (!o)
            return -1;
        o->kind = AP_ENDPOINT;
        o->url = prov_url(p, p->result_content_path, var_id, (void *)remote_id, "archive");
        o->expires_at = w.expires;
        if (!o->url)
            pl->n--; /* a template that cannot be expanded: no output to fetch */
        return 0;
    }
    if (pl->doc && p->mode == CFG_MODE_ASYNC_POLL) {
        if (p->result_outputs) /* a finished task's outputs: a list, or its one value */
            jpath_each_list(p->result_outputs, pl->doc, add_item, &w);
    } else if (pl->doc && p->outputs_received) {
        jpath_each(p->outputs_received, pl->doc, add_item, &w);
    }
    return w.oom ? -1 : 0;
}

int ap_claim_room(int inflight_left, int engine_room, int batch)
{
    int n = inflight_left < engine_room ? inflight_left : engine_room;
    n = n < batch ? n : batch;
    return n > 0 ? n : 0;
}

long ap_copy_timeout_ms(long configured_ms, double now, double lease_end, double margin_s)
{
    double left_ms = (lease_end - margin_s - now) * 1000.0;
    long least = configured_ms < AP_COPY_MIN_MS ? configured_ms : AP_COPY_MIN_MS;
    if (left_ms < (double)least || left_ms < 1.0)
        return 0;
    return left_ms < (double)configured_ms ? (long)left_ms : configured_ms;
}

int ap_ends_due(double now, double since, double first_end, double max_wait_s, double margin_s)
{
    return now - since >= max_wait_s || first_end - now <= margin_s;
}

int ap_expired_untried(int attempts, double now, double expires_at)
{
    return expires_at > 0 && now >= expires_at && attempts > 1;
}

long long ap_store_retry_ms(double rand01)
{
    if (!(rand01 >= 0) || rand01 >= 1) /* NaN too */
        rand01 = 0;
    return AP_STORE_RETRY_MIN_MS +
           (long long)(rand01 * (double)(AP_STORE_RETRY_MAX_MS - AP_STORE_RETRY_MIN_MS));
}

enum ap_verdict ap_after_failure(int attempts, double now, double expires_at, int permanent,
                                 int store, double rand01, long long *delay_ms)
{
    *delay_ms = 0;
    if (permanent)
        return AP_FAILED;
    if (expires_at > 0 && now >= expires_at)
        return AP_EXPIRED;
    if (expires_at <= 0 && attempts >= AP_MAX_ATTEMPTS_NO_EXPIRY && !store)
        return AP_FAILED;
    long long d = bo_full_jitter_ms(attempts - 1, RETRY_BASE_MS, RETRY_CAP_MS, rand01, -1);
    if (d < 100)
        d = 100; /* never a busy loop */
    if (expires_at > 0) {
        /* The last try is made before the URL expires, not after it. */
        long long left = (long long)((expires_at - now) * 1000.0);
        if (d >= left)
            d = left > 200 ? left - 100 : left;
    }
    *delay_ms = d;
    return AP_RETRY;
}
