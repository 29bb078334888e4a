#include "idemgate/reconciler.h"

#include "idemgate/attempt.h"
#include "idemgate/crash.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/store.h"
#include "idemgate/tmpl.h"
#include "idemgate/wpool.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A list is asked for tasks created in the recovery window around the first send, widened by
 * this much for clock differences between us and the provider. */
#define LIST_SLACK_S 120
#define IDLE_SLEEP_MS 200

enum recon_verdict recon_list_verdict(int matches, int window_closed)
{
    if (matches == 1)
        return RV_FOUND;
    if (matches > 1)
        return RV_REVIEW; /* several tasks claim our reference: a human must choose */
    if (matches == 0)
        return window_closed ? RV_ABSENT : RV_LATER; /* it may still appear in the list */
    return window_closed ? RV_REVIEW : RV_LATER;     /* the list failed: no proof either way */
}

enum recon_verdict recon_lookup_verdict(int http_status, int window_closed)
{
    if (http_status >= 200 && http_status < 300)
        return RV_FOUND;
    if (http_status == 404)
        return RV_ABSENT;
    return window_closed ? RV_REVIEW : RV_LATER;
}

struct lookup_vars {
    const char *client_ref;
    char since[24], until[24];
};

static const char *lookup_var(const char *name, size_t len, void *arg)
{
    struct lookup_vars *v = arg;
    if (len == 10 && memcmp(name, "client_ref", 10) == 0)
        return v->client_ref;
    if (len == 5 && memcmp(name, "since", 5) == 0)
        return v->since;
    if (len == 5 && memcmp(name, "until", 5) == 0)
        return v->until;
    return NULL;
}

/* Writes the verdict under the reconciler's lease (state unknown → next). */
static void write_verdict(struct db *db, const struct store_claim *c, enum op_state next,
                          long delay_ms, const char *outcome, const char *error,
                          const struct up_response *res, const char *remote_id, double t0)
{
    struct store_finish f = {.tenant_id = c->tenant_id,
                             .id = c->id,
                             .lease_version = c->lease_version,
                             .from = ST_UNKNOWN,
                             .kind = "reconcile",
                             .state = next,
                             .outcome = outcome,
                             .http_status = res ? res->http_status : 0,
                             .curl_code = res ? res->curl_code : 0,
                             .bytes_sent = res ? res->bytes_sent : 0,
                             /* The found task is the result of a synchronous create. */
                             .resp_headers = next == ST_COMPLETED && res ? res->headers_json : NULL,
                             .resp_body = next == ST_COMPLETED && res ? res->body : NULL,
                             .resp_body_len = next == ST_COMPLETED && res ? res->body_len : 0,
                             .remote_id = remote_id,
                             .error = error,
                             .retry_delay_ms = delay_ms,
                             .outputs_received = -1,
                             .outputs_requested = -1,
                             .started_at = t0,
                             .finished_at = attempt_wall_now()};
    int applied = 0;
    int e = store_finish(db, &f, &applied);
    if (e == STORE_OK && !applied)
        metrics_safety(MS_FENCED_WRITE);
    if (e == STORE_OK && applied && next != ST_UNKNOWN)
        metrics_unknown_seconds((double)c->since_first_ms / 1000);
    if (e == STORE_OK && applied && (next == ST_COMPLETED || next == ST_ACCEPTED))
        metrics_safety(MS_RECONCILED_NO_RESEND);
    if (e == STORE_OK && applied && next == ST_REVIEW)
        metrics_safety(MS_REVIEW_ENTERED);
    if (e < 0 || !applied)
        LOG(LOG_WARN, "reconcile_write_dropped", LS("job_id", c->id), LS("verdict", outcome));
    else
        LOG(LOG_INFO, "reconciled", LS("job_id", c->id), LS("provider", c->provider),
            LS("verdict", outcome), LS("state", st_name(next)), LS("remote_id", remote_id));
}

struct match_ctx {
    const struct cfg_provider *p;
    const char *ref;
    int n;
    const cJSON *found;
};

static void match_item(const cJSON *item, void *arg)
{
    struct match_ctx *m = arg;
    const char *v = jpath_string(m->p->list_match, item);
    if (v && strcmp(v, m->ref) == 0) {
        m->n++;
        m->found = item;
    }
}

/* Expands a lookup or list template against the provider's base URL. */
static char *reconcile_url(const struct cfg_provider *p, const char *tmpl, struct lookup_vars *v)
{
    char err[128], *path = NULL, *url = NULL;
    if (tmpl_expand(tmpl, TMPL_URL_SEGMENT, lookup_var, v, &path, err, sizeof(err)) < 0) {
        LOG(LOG_ERROR, "reconcile_template", LS("provider", p->name), LS("error", err));
        return NULL;
    }
    size_t n = strlen(p->base_url) + strlen(path) + 1;
    url = malloc(n);
    if (url)
        snprintf(url, n, "%s%s", p->base_url, path);
    free(path);
    return url;
}

/* Asks the provider whether the task exists, and writes what that proves. */
static void look(const struct cfg_provider *p, struct db *db, const struct store_claim *c,
                 int window_closed, double t0)
{
    struct lookup_vars v = {.client_ref = c->id};
    /* The window comes from the database's clock: a replica whose own clock is off must not
     * look in the wrong minutes, miss the task, and call it absent. */
    snprintf(v.since, sizeof(v.since), "%lld", (long long)c->first_sent_db - LIST_SLACK_S);
    snprintf(v.until, sizeof(v.until), "%lld", (long long)c->now_db + LIST_SLACK_S);
    int list = p->reconcile == RECON_LIST_MATCH;
    char *url = reconcile_url(p, list ? p->list_path : p->lookup_path, &v);
    struct up_response res;
    memset(&res, 0, sizeof(res));
    enum recon_verdict verdict;
    const char *remote = NULL;
    char *remote_copy = NULL, *task_json = NULL;
    cJSON *doc = NULL;
    if (!url) {
        verdict = window_closed ? RV_REVIEW : RV_LATER;
    } else {
        int rc = attempt_get(p, c->credential, url, &res);
        const char *end = NULL;
        if (rc == 0 && res.body)
            doc = cJSON_ParseWithLengthOpts(res.body, res.body_len, &end, 0);
        if (list) {
            struct match_ctx m = {p, c->id, 0, NULL};
            int ok = rc == 0 && res.http_status >= 200 && res.http_status < 300 && doc;
            if (ok)
                jpath_each(p->list_items, doc, match_item, &m);
            verdict = recon_list_verdict(ok ? m.n : -1, window_closed);
            if (m.n > 1)
                metrics_safety(MS_SUSPECTED_DUPLICATE);
            if (verdict == RV_FOUND) {
                remote = p->list_id ? jpath_string(p->list_id, m.found) : NULL;
                task_json = cJSON_PrintUnformatted(m.found);
            }
        } else {
            verdict = recon_lookup_verdict(rc == 0 ? res.http_status : 0, window_closed);
            if (verdict == RV_FOUND && doc && p->lookup_id)
                remote = jpath_string(p->lookup_id, doc);
        }
        if (remote)
            remote_copy = strdup(remote);
    }
    if (task_json) {
        /* The matching task, not the whole list, is the operation's result. */
        free(res.body);
        res.body = task_json;
        res.body_len = strlen(task_json);
    }
    switch (verdict) {
    case RV_FOUND:
        /* A synchronous provider's task is its result; an async one's still has to be polled. */
        if (p->mode == CFG_MODE_ASYNC_POLL && remote_copy)
            write_verdict(db, c, ST_ACCEPTED, 0, "found", NULL, NULL, remote_copy, t0);
        else
            write_verdict(db, c, ST_COMPLETED, 0, "found", NULL, &res, remote_copy, t0);
        break;
    case RV_ABSENT:
        write_verdict(db, c, ST_PREPARED, 0, "absent", "proven absent at the provider; resending",
                      &res, NULL, t0);
        break;
    case RV_REVIEW:
        write_verdict(db, c, ST_REVIEW, 0, list ? "ambiguous_match" : "undecided",
                      "reconciliation could not decide: an operator must resolve it", &res, NULL,
                      t0);
        break;
    case RV_LATER:
        write_verdict(db, c, ST_UNKNOWN, p->reconcile_interval_ms, "not_yet", NULL, &res, NULL,
                      t0);
        break;
    }
    cJSON_Delete(doc);
    free(remote_copy);
    free(url);
    up_response_fini(&res);
}

static void reconcile_one(const struct cfg *cfg, struct db *db, struct store_claim *c)
{
    double t0 = attempt_wall_now();
    const struct cfg_provider *p = cfg_find_provider(cfg, c->provider, strlen(c->provider));
    if (!p) {
        write_verdict(db, c, ST_UNKNOWN, 60000, "not_configured",
                      "provider is not configured on this replica", NULL, NULL, t0);
        return;
    }
    int window_closed = c->since_first_ms >= p->recovery_window_ms;
    if (strcmp(c->reconcile_strategy, "idempotent_resubmit") == 0) {
        /* The provider dedupes on our key: a resend is a transport retry, inside the budget. */
        if (c->transport_attempts >= p->max_attempts || c->since_first_ms >= p->deadline_ms) {
            write_verdict(db, c, ST_REVIEW, 0, "budget_exhausted",
                          "no definite answer within the retry budget: an operator must resolve "
                          "it",
                          NULL, NULL, t0);
            return;
        }
        double before = attempt_mono_now();
        if (store_reconcile_send(db, c, cfg->lease_seconds) != STORE_OK)
            return; /* fenced or unreachable: the next claim decides */
        metrics_safety(MS_PROTECTED_RESEND);
        c->from_unknown = 1;
        attempt_create(cfg, db, c, before);
        return;
    }
    if (strcmp(c->reconcile_strategy, "get_by_client_id") == 0 && p->lookup_path) {
        look(p, db, c, window_closed, t0);
        return;
    }
    if (strcmp(c->reconcile_strategy, "list_match") == 0 && p->list_path) {
        look(p, db, c, window_closed, t0);
        return;
    }
    /* No way to look: wait out the recovery window, then hand it to a human. Never resend. */
    if (window_closed)
        write_verdict(db, c, ST_REVIEW, 0, "window_closed",
                      "no way to reconcile with this provider and the recovery window closed",
                      NULL, NULL, t0);
    else
        write_verdict(db, c, ST_UNKNOWN, (long)(p->recovery_window_ms - c->since_first_ms),
                      "waiting", NULL, NULL, NULL, t0);
}

/* One reconciler step: claim one due unknown operation and look. */
static int recon_step(const struct cfg *cfg, struct db *db)
{
    struct store_claim c;
    if (store_reconcile_claim(db, cfg->instance_id, cfg->lease_seconds, &c) != STORE_OK)
        return 0;
    reconcile_one(cfg, db, &c);
    store_claim_fini(&c);
    return 1;
}

struct wpool *recon_start(const struct cfg *cfg)
{
    return wpool_start(cfg, cfg->reconcile_workers, recon_step, IDLE_SLEEP_MS);
}
