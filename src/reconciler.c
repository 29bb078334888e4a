#include "idemgate/reconciler.h"

#include "idemgate/attempt.h"
#include "idemgate/clock.h"
#include "idemgate/crash.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/provider.h"
#include "idemgate/lease.h"
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

enum recon_verdict recon_list_verdict(int matches, int window_closed, int grace_passed)
{
    if (matches == 1)
        return RV_FOUND;
    if (matches > 1)
        return RV_REVIEW; /* several tasks claim our reference: a human must choose */
    if (matches == 0 && grace_passed)
        return window_closed ? RV_REVIEW : RV_ABSENT; /* no resend once the window is over */
    if (matches == 0)
        return RV_LATER; /* it may still be committed after our timeout */
    return window_closed ? RV_REVIEW : RV_LATER; /* the search failed: no proof either way */
}

enum recon_verdict recon_lookup_verdict(int http_status, int window_closed, int grace_passed)
{
    int matches = http_status >= 200 && http_status < 300 ? 1 : http_status == 404 ? 0 : -1;
    return recon_list_verdict(matches, window_closed, grace_passed);
}

enum recon_plan recon_plan(const struct recon_facts *f)
{
    if (f->webhook_hint)
        return RP_ADOPT;
    switch (f->strategy) {
    case RECON_IDEMPOTENT_RESUBMIT:
        /* The provider dedupes on our key: a resend is a transport retry, inside the budget
         * and the window the provider remembers keys for. After a cancel it is a send like
         * any other: never. */
        if (f->cancel_requested)
            return f->window_closed ? RP_REVIEW : RP_WAIT;
        return f->budget_left && !f->window_closed ? RP_RESEND : RP_REVIEW;
    case RECON_GET_BY_CLIENT_ID:
    case RECON_LIST_MATCH:
        if (f->can_look)
            return RP_LOOK;
        return f->window_closed ? RP_REVIEW : RP_WAIT;
    case RECON_NONE:
    default:
        /* No way to look: wait out the window (a late webhook may still name the task), then
         * an operator decides. Never resend. */
        return f->window_closed ? RP_REVIEW : RP_WAIT;
    }
}

enum op_state recon_found_state(int async, int has_id, int result_read)
{
    /* A found task is the truth, whatever the client asked meanwhile: a cancel changes what is
     * done with it (the poller cancels a running task at the provider), never the state. */
    if (async)
        return has_id ? ST_ACCEPTED : ST_REVIEW;
    return result_read ? ST_COMPLETED : ST_REVIEW;
}

struct lookup_vars {
    const char *client_ref, *id;
    char since[24], until[24];
};

static const char *lookup_var(const char *name, size_t len, void *arg)
{
    struct lookup_vars *v = arg;
    if (len == 10 && memcmp(name, "client_ref", 10) == 0)
        return v->client_ref;
    if (len == 2 && memcmp(name, "id", 2) == 0)
        return v->id;
    if (len == 5 && memcmp(name, "since", 5) == 0)
        return v->since;
    if (len == 5 && memcmp(name, "until", 5) == 0)
        return v->until;
    return NULL;
}

/* What reconciling concluded, to be written under the reconciler's lease. */
struct verdict_write {
    enum op_state next;
    long delay_ms;
    const char *outcome;
    const char *error;
    const struct up_response *res; /* the provider's answer kept as the result (completed) */
    const char *remote_id;
    int outputs_received; /* -1: not counted */
    const char *usage;
    long long cost_micros; /* -1: none computed */
    int unpriced;
    const struct cfg_provider *p; /* for the spend metric; NULL without a cost */
};

/* Writes the verdict under the reconciler's lease (state unknown → next). */
static void write_verdict(struct db *db, const struct store_claim *c, const struct verdict_write *w,
                          double t0)
{
    const struct up_response *res = w->res;
    /* The found task is the result of a synchronous create. */
    int keep = res && (w->next == ST_COMPLETED || w->next == ST_FAILED) && res->body &&
               !res->body_truncated;
    struct store_finish f;
    store_finish_init(&f, c, "reconcile", ST_UNKNOWN);
    store_finish_evidence(&f, res, keep);
    f.state = w->next;
    f.outcome = w->outcome;
    f.remote_id = w->remote_id;
    f.error = w->error;
    f.retry_delay_ms = w->delay_ms;
    f.outputs_received = w->outputs_received;
    f.usage = w->usage;
    f.cost_micros = w->cost_micros;
    f.started_at = t0;
    int applied = 0;
    int e = store_finish(db, &f, &applied);
    if (e == STORE_OK && applied && w->p && f.cost_micros >= 0)
        metrics_spend(w->p->name, w->p->pricing.currency, f.cost_micros, w->unpriced);
    if (e == STORE_OK && !applied)
        metrics_safety(MS_FENCED_WRITE);
    if (e == STORE_OK && applied && w->next != ST_UNKNOWN)
        metrics_unknown_seconds((double)c->since_first_ms / 1000);
    if (e == STORE_OK && applied && (w->next == ST_COMPLETED || w->next == ST_ACCEPTED))
        metrics_safety(MS_RECONCILED_NO_RESEND);
    if (e == STORE_OK && applied && w->next == ST_REVIEW)
        metrics_safety(MS_REVIEW_ENTERED);
    if (e < 0 || !applied)
        LOG(LOG_WARN, "reconcile_write_dropped", LS("job_id", c->id), LS("verdict", w->outcome));
    else
        LOG(LOG_INFO, "reconciled", LS("job_id", c->id), LS("provider", c->provider),
            LS("verdict", w->outcome), LS("state", st_name(w->next)),
            LS("remote_id", w->remote_id));
}

static void write_simple(struct db *db, const struct store_claim *c, enum op_state next,
                         long delay_ms, const char *outcome, const char *error, double t0)
{
    struct verdict_write w = {next, delay_ms, outcome, error, NULL, NULL, -1, NULL, -1, 0, NULL};
    write_verdict(db, c, &w, t0);
}

/* A GET of url with the operation's credential. */
static int get(const struct cfg_provider *p, const struct store_claim *c, const char *url,
               struct up_response *res)
{
    struct prov_call call = {.method = "GET", .url = url, .credential = c->credential};
    return prov_call(p, &call, res);
}

/* The result of a found synchronous task, shaped as its create's answer: the part of the answer
 * the profile's reconcile.found_result names (re-printed), or the whole answer as it came.
 * Returns 0 with *out filled (its body owned by the caller when *owned), or -1 when the answer
 * does not hold it: then nothing may be written completed. */
static int found_result(const struct cfg_provider *p, const struct up_response *res,
                        struct up_response *out, int *owned)
{
    *out = *res;
    *owned = 0;
    if (!res->body || res->body_truncated)
        return -1;
    cJSON *doc = cJSON_ParseWithLength(res->body, res->body_len);
    const cJSON *node = doc && p->found_result ? jpath_first(p->found_result, doc) : doc;
    int ok = node && (cJSON_IsObject(node) || cJSON_IsArray(node));
    if (ok && p->found_result) {
        out->body = cJSON_PrintUnformatted(node);
        out->body_len = out->body ? strlen(out->body) : 0;
        *owned = out->body != NULL;
        ok = *owned;
    }
    cJSON_Delete(doc);
    return ok ? 0 : -1;
}

/* A found synchronous task's verdict: completed with the result, its outputs counted and its
 * cost computed as a dispatched create's would be, or review when the answer does not hold the
 * result where the profile says, or holds none of the outputs asked for where the profile reads
 * them (never completed with fewer outputs than its result holds). */
static void found_sync(const struct cfg_provider *p, struct db *db, const struct store_claim *c,
                       const struct up_response *res, const char *remote_id, double t0)
{
    struct up_response fres;
    int owned = 0;
    struct attempt_results rs = {.received = -1};
    int read = found_result(p, res, &fres, &owned) == 0;
    if (read)
        attempt_count_results(p, &fres, &rs);
    /* Outputs asked for and none where the profile reads them: the result is not where it was
     * looked for (a create answer is never adopted as empty on a guess). */
    if (read && c->outputs_requested > 0 && rs.received == 0)
        read = 0;
    struct verdict_write w = {recon_found_state(0, remote_id != NULL, read), 0, "found", NULL,
                              NULL, remote_id, -1, NULL, -1, 0, NULL};
    if (w.next == ST_COMPLETED) {
        w.res = &fres;
        w.outputs_received = rs.received;
        w.usage = rs.usage;
        if (p->pricing.present) {
            w.cost_micros = price_actual_raw(&p->pricing, (const char *)c->body, c->body_len,
                                             c->outputs_requested, rs.received, rs.usage,
                                             &w.unpriced);
            w.p = p;
        }
        if (c->cancel_requested) {
            w.outcome = "found_after_cancel";
            w.error = "the cancel came too late: the task was found finished at the provider "
                      "(paid); its result is kept";
        }
    } else {
        w.outcome = "found_unreadable";
        w.error = "a task was found but its result (with its outputs) is not where the profile "
                  "reads it (reconcile.found_result, outputs.received): an operator must "
                  "resolve it";
    }
    write_verdict(db, c, &w, t0);
    free(rs.usage);
    if (owned)
        free(fres.body);
}

/* A task was found (by list, lookup or a webhook's hint): adopt it. An async task is polled to
 * its end — the poller first sends the provider's cancel when the client cancelled — and a
 * synchronous one is the result. */
static void found(const struct cfg_provider *p, struct db *db, const struct store_claim *c,
                  const struct up_response *res, const char *remote_id, double t0)
{
    if (p->mode != CFG_MODE_ASYNC_POLL) {
        found_sync(p, db, c, res, remote_id, t0);
        return;
    }
    enum op_state next = recon_found_state(1, remote_id != NULL, 1);
    struct verdict_write w = {next, 0, "found", NULL, NULL, remote_id, -1, NULL, -1, 0, NULL};
    if (next == ST_REVIEW) {
        w.outcome = "found_without_id";
        w.error = "a task was found but its id cannot be read: an operator must resolve it";
    } else if (c->cancel_requested) {
        w.outcome = "found_after_cancel";
        w.error = p->cancel_path ? "canceled while unknown: the task was found at the provider; "
                                   "it is cancelled there and followed to its end"
                                 : "canceled while unknown: the task was found at the provider, "
                                   "which cannot cancel it; it is followed to its end";
    }
    write_verdict(db, c, &w, t0);
}

/* Absence proven by search (or not yet): the create may be sent again, unless cancelled. */
static void not_found(const struct cfg_provider *p, struct db *db, const struct store_claim *c,
                      enum recon_verdict v, const char *how, double t0)
{
    if (v == RV_ABSENT && c->cancel_requested)
        write_simple(db, c, ST_FAILED, 0, "absent_canceled",
                     "canceled; proven never created at the provider", t0);
    else if (v == RV_ABSENT)
        write_simple(db, c, ST_PREPARED, 0, "absent", "proven absent at the provider; resending",
                     t0);
    else if (v == RV_REVIEW)
        write_simple(db, c, ST_REVIEW, 0, how,
                     "reconciliation could not decide: an operator must resolve it", t0);
    else
        write_simple(db, c, ST_UNKNOWN, p->reconcile_interval_ms, "not_yet", NULL, t0);
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

/* The URL of one list page: the first from the template, the next with the cursor added. */
static char *page_url(const struct cfg_provider *p, struct lookup_vars *v, const char *cursor)
{
    char *first = prov_url(p, p->list_path, lookup_var, v, "list");
    if (!first || !cursor)
        return first;
    char *esc = prov_query_escape(cursor), *url = NULL;
    if (esc && asprintf(&url, "%s%c%s=%s", first, strchr(first, '?') ? '&' : '?',
                        p->list_cursor_param, esc) < 0)
        url = NULL;
    free(esc);
    free(first);
    return url;
}

/* Reads every page of the provider's list for the window from the first send to now and counts
 * the tasks carrying our reference. Returns the count, or -1 when a page failed or the pages
 * ran past max_pages: then nothing is proven. On one match, *task is that task's JSON and
 * *remote its id (read exactly). */
static int search_list(const struct cfg_provider *p, const struct store_claim *c, char **task,
                       char **remote)
{
    struct lookup_vars v = {.client_ref = c->id};
    /* The window comes from the database's clock: a replica whose own clock is off must not
     * look in the wrong minutes, miss the task, and call it absent. */
    snprintf(v.since, sizeof(v.since), "%lld", (long long)c->first_sent_db - LIST_SLACK_S);
    snprintf(v.until, sizeof(v.until), "%lld", (long long)c->now_db + LIST_SLACK_S);
    char *cursor = NULL;
    int total = 0;
    for (int page = 0;; page++) {
        if (page == p->list_max_pages) {
            total = -1;
            break;
        }
        char *url = page_url(p, &v, cursor);
        struct up_response res;
        memset(&res, 0, sizeof(res));
        int rc = url ? get(p, c, url, &res) : -1;
        free(url);
        if (rc < 0 || res.http_status < 200 || res.http_status >= 300 || res.body_truncated) {
            up_response_fini(&res);
            total = -1;
            break;
        }
        cJSON *doc = prov_id_doc(res.body, res.body_len);
        struct match_ctx m = {p, c->id, 0, NULL};
        if (doc)
            jpath_each(p->list_items, doc, match_item, &m);
        total = doc ? total + m.n : -1;
        if (m.n == 1 && !*task) {
            *task = cJSON_PrintUnformatted(m.found);
            const char *id = p->list_id ? prov_read_id(p->list_id, m.found) : NULL;
            *remote = id ? strdup(id) : NULL;
        }
        const char *next = doc && p->list_next_cursor ? jpath_string(p->list_next_cursor, doc)
                                                      : NULL;
        free(cursor);
        cursor = next && *next ? strdup(next) : NULL;
        cJSON_Delete(doc);
        up_response_fini(&res);
        if (total < 0 || !cursor)
            break;
    }
    free(cursor);
    return total;
}

/* Asks the provider whether the task exists, and writes what that proves. */
static void look(const struct cfg_provider *p, struct db *db, const struct store_claim *c,
                 int window_closed, double t0)
{
    int grace_passed = c->since_ambiguous_ms >= p->absent_grace_ms;
    struct up_response res;
    memset(&res, 0, sizeof(res));
    char *remote = NULL;
    enum recon_verdict verdict;
    const char *how = "undecided";
    if (p->reconcile == RECON_LIST_MATCH) {
        char *task = NULL;
        int matches = search_list(p, c, &task, &remote);
        if (matches > 1)
            metrics_safety(MS_SUSPECTED_DUPLICATE);
        verdict = recon_list_verdict(matches, window_closed, grace_passed);
        how = "ambiguous_match";
        if (task) { /* the matching task, not the whole list, is the operation's result */
            res.body = task;
            res.body_len = strlen(task);
            res.http_status = 200;
        }
    } else {
        struct lookup_vars v = {.client_ref = c->id};
        char *url = prov_url(p, p->lookup_path, lookup_var, &v, "lookup");
        int rc = url ? get(p, c, url, &res) : -1;
        free(url);
        verdict = recon_lookup_verdict(rc == 0 && !res.body_truncated ? res.http_status : 0,
                                       window_closed, grace_passed);
        cJSON *doc = verdict == RV_FOUND ? prov_id_doc(res.body, res.body_len) : NULL;
        const char *id = doc && p->lookup_id ? prov_read_id(p->lookup_id, doc) : NULL;
        remote = id ? strdup(id) : NULL;
        cJSON_Delete(doc);
    }
    if (verdict == RV_FOUND)
        found(p, db, c, &res, remote, t0);
    else
        not_found(p, db, c, verdict, how, t0);
    free(remote);
    up_response_fini(&res);
}

/* A verified webhook named a task by our client reference (or an operator resolved the job as
 * found): read the task by its id and adopt it, its answer being the result, when it exists and
 * — for a webhook, where the profile says where — carries our reference. */
static void adopt_hinted(const struct cfg_provider *p, struct db *db, const struct store_claim *c,
                         int window_closed, double t0)
{
    struct up_response res;
    int ok = prov_read_task(p, c->credential, c->webhook_hint, c->id, &res) == 0;
    if (ok && p->task_client_ref && !c->operator_found)
        ok = prov_task_is(p, &res, c->id);
    if (ok)
        found(p, db, c, &res, c->webhook_hint, t0);
    else if (c->operator_found) /* the operator decides again, with what the provider said */
        write_simple(db, c, ST_REVIEW, 0, "found_unreadable",
                     "the task an operator named could not be read at the provider", t0);
    else
        write_simple(db, c, window_closed ? ST_REVIEW : ST_UNKNOWN, p->reconcile_interval_ms,
                     "hint_unproven", "a webhook named a task that could not be read as ours",
                     t0);
    up_response_fini(&res);
}

/* Decides what to do with a claimed unknown operation (recon_plan) and does it. */
static void reconcile_one(const struct cfg *cfg, struct db *db, struct store_claim *c,
                          double claimed_mono, void *arg)
{
    (void)arg;
    (void)claimed_mono; /* a resend takes its own time: the lease was renewed for it */
    double t0 = clock_wall();
    const struct cfg_provider *p = cfg_find_provider(cfg, c->provider, strlen(c->provider));
    if (!p) {
        write_simple(db, c, ST_UNKNOWN, 60000, "not_configured",
                     "provider is not configured on this replica", t0);
        return;
    }
    struct recon_facts f = {
        .strategy = c->strategy,
        .can_look = (c->strategy == RECON_GET_BY_CLIENT_ID && p->lookup_path &&
                     p->reconcile == RECON_GET_BY_CLIENT_ID) ||
                    (c->strategy == RECON_LIST_MATCH && p->list_path &&
                     p->reconcile == RECON_LIST_MATCH),
        .cancel_requested = c->cancel_requested,
        .window_closed = c->since_first_ms >= p->recovery_window_ms,
        .budget_left = c->transport_attempts < p->max_attempts && c->since_first_ms < p->deadline_ms,
        .webhook_hint = c->webhook_hint != NULL,
    };
    switch (recon_plan(&f)) {
    case RP_ADOPT:
        adopt_hinted(p, db, c, f.window_closed, t0);
        return;
    case RP_LOOK:
        look(p, db, c, f.window_closed, t0);
        return;
    case RP_RESEND: {
        double before = clock_mono();
        if (store_reconcile_send(db, c, cfg->lease_seconds) != STORE_OK)
            return; /* fenced, cancelled meanwhile, or unreachable: the next claim decides */
        metrics_safety(MS_PROTECTED_RESEND);
        c->from_unknown = 1;
        attempt_create(cfg, db, c, before);
        return;
    }
    case RP_WAIT:
        write_simple(db, c, ST_UNKNOWN, (long)(p->recovery_window_ms - c->since_first_ms),
                     "waiting", NULL, t0);
        return;
    case RP_REVIEW:
        write_simple(db, c, ST_REVIEW, 0, c->cancel_requested ? "canceled_unknown" : "window_closed",
                     c->cancel_requested
                         ? "cancelled while its fate was unknown; it was never sent again and "
                           "cannot be looked up: an operator must resolve it"
                         : "no definite answer within the recovery window or the retry budget: "
                           "an operator must resolve it",
                     t0);
        return;
    }
}

static const struct wpool_spec recon_pool = {
    .name = "reconcile",
    .claim = store_reconcile_claim,
    .work = reconcile_one,
    .idle_ms = IDLE_SLEEP_MS,
    .error_ms = IDLE_SLEEP_MS,
};

struct wpool *recon_start(const struct cfg *cfg)
{
    return wpool_start(cfg, cfg->reconcile_workers, &recon_pool);
}
