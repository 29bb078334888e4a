#include "idemgate/reconciler.h"

#include "idemgate/archive.h"
#include "idemgate/attempt.h"
#include "idemgate/clock.h"
#include "idemgate/crash.h"
#include "idemgate/engine.h"
#include "idemgate/lease.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/provider.h"
#include "idemgate/resultq.h"
#include "idemgate/resume.h"
#include "idemgate/secrets.h"
#include "idemgate/sse.h"
#include "idemgate/states.h"
#include "idemgate/upload.h"
#include "idemgate/uplstore.h"
#include "idemgate/wpool.h"

#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A list is asked for tasks created in the recovery window around the first send, widened by
 * this much for clock differences between us and the provider. */
#define LIST_SLACK_S 120
#define IDLE_SLEEP_MS 200
/* What a lease keeps back for writing what its calls proved. */
#define LEASE_MARGIN_S 1.0
/* Results one thread writes before it looks at anything else. */
#define RESULTS_PER_TURN 64

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

int recon_same_reference(const char *recorded, const char *current)
{
    const char *r = recorded ? strrchr(recorded, '#') : NULL;
    if (!r)
        return 1;
    const char *c = current ? strrchr(current, '#') : NULL;
    return c && strcmp(r, c) == 0;
}

enum recon_page_step recon_next_page(int total, int has_cursor, int pages_read, int max_pages,
                                     int past_lease)
{
    if (total < 0)
        return RPS_UNPROVEN; /* a page failed */
    if (!has_cursor)
        return RPS_DONE; /* every page read: the count is the truth */
    if (pages_read >= max_pages || past_lease)
        return RPS_UNPROVEN; /* more pages than may be read, or than the lease leaves time for */
    return RPS_NEXT;
}

int recon_search_proof(int total, int items, int readable)
{
    if (total == 0 && items > 0 && readable == 0)
        return -1;
    return total;
}

long recon_later_ms(long interval_ms, long grace_ms, long long since_ambiguous_ms)
{
    long long left = (long long)grace_ms - since_ambiguous_ms;
    return left > interval_ms ? (long)left : interval_ms;
}

int recon_lookup_proves(const struct cfg_provider *p, int http_status, const char *body,
                        size_t body_len, const char *client_ref)
{
    int ok2xx = http_status >= 200 && http_status < 300;
    if ((!ok2xx && http_status != 404) || !body || !body_len)
        return -1;
    cJSON *doc = cJSON_ParseWithLength(body, body_len);
    const char *v = !doc ? NULL
                    : ok2xx ? jpath_string(p->lookup_client_ref, doc)
                            : jpath_string(p->lookup_absent, doc);
    int proves = !v                                       ? -1
                 : ok2xx                                  ? (strcmp(v, client_ref) == 0 ? 1 : -1)
                 : strcmp(v, p->lookup_absent_equals) == 0 ? 0
                                                           : -1;
    cJSON_Delete(doc);
    return proves;
}

enum recon_verdict recon_lookup_verdict(int proves, int window_closed, int grace_passed)
{
    return recon_list_verdict(proves < 0 ? -1 : proves, window_closed, grace_passed);
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

enum recon_adopt_miss recon_adopt_miss(int operator_found, int has_hint, int answered,
                                       int readable_by_id, int strategy_none, int window_closed)
{
    if (operator_found)
        return RAM_NAMED_UNREADABLE;
    if (!has_hint)
        return RAM_STREAM_ID_UNREAD;
    if (answered)
        return RAM_NOT_OURS;
    if (!readable_by_id)
        return strategy_none || window_closed ? RAM_HINT_REVIEW : RAM_SEARCH_FROM_NOW;
    return RAM_HINT_KEPT;
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
    /* For the spend metric (with a cost), and an accepted task's poll deadline: a task adopted
     * without one was polled for ever. */
    const struct cfg_provider *p;
    int keep_record; /* res is kept as the operation's record whatever the state (a resumed
                        stream cut again: the longer record, resumed from its end next time) */
};

/* Writes the verdict under the reconciler's lease (state unknown → next); ambiguous: a task may
 * exist as of now (the absent grace counts from this write). */
static void write_verdict_as(struct db *db, const struct store_claim *c,
                             const struct verdict_write *w, double t0, int ambiguous)
{
    const struct up_response *res = w->res;
    /* The found task is the result of a synchronous create. */
    int keep = res && (w->next == ST_COMPLETED || w->next == ST_FAILED || w->keep_record) &&
               res->body && !res->body_truncated;
    struct store_finish f;
    store_finish_init(&f, c, "reconcile", ST_UNKNOWN);
    store_finish_evidence(&f, res, keep);
    f.state = w->next;
    f.outcome = w->outcome;
    f.remote_id = w->remote_id;
    f.error = w->error;
    f.retry_delay_ms = w->delay_ms;
    f.ambiguous = ambiguous;
    f.outputs_received = w->outputs_received;
    f.usage = w->usage;
    f.cost_micros = w->cost_micros;
    if (w->next == ST_ACCEPTED && w->p)
        f.poll_deadline_ms = w->p->poll_deadline_ms;
    f.started_at = t0;
    /* A found result is written with its outputs' archive plan, as a dispatched one is: left
     * unplanned, only a replica archiving this provider would plan it (the janitor keeps such a
     * job past its expiry, and the archive's gauges count it, until one does). */
    char *plan = w->next == ST_COMPLETED && w->p
                     ? archive_plan_json(w->p, &f, c->remote_id, c->credential, NULL)
                     : NULL;
    f.archive_plan = plan;
    int applied = 0;
    int e = store_finish(db, &f, &applied);
    if (e == STORE_OK && applied && w->next == ST_COMPLETED && w->p)
        archive_plan_written(plan, c->id, w->p->name);
    free(plan);
    if (e == STORE_OK && applied && w->p && f.cost_micros >= 0)
        metrics_spend(w->p->name, w->p->pricing.currency, f.cost_micros, w->unpriced);
    if (e == STORE_OK && applied && w->next == ST_COMPLETED)
        metrics_job_seconds(c->provider, (double)c->since_first_ms / 1000 + (clock_wall() - t0));
    if (e == STORE_OK && !applied)
        metrics_safety(MS_FENCED_WRITE);
    if (e == STORE_OK && applied && w->next != ST_UNKNOWN)
        metrics_unknown_seconds((double)c->since_ambiguous_ms / 1000); /* unknown since then */
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

static void write_verdict(struct db *db, const struct store_claim *c, const struct verdict_write *w,
                          double t0)
{
    write_verdict_as(db, c, w, t0, 0);
}

static void write_simple(struct db *db, const struct store_claim *c, enum op_state next,
                         long delay_ms, const char *outcome, const char *error, double t0)
{
    struct verdict_write w = {next, delay_ms, outcome, error, NULL, NULL, -1, NULL, -1, 0, NULL, 0};
    write_verdict(db, c, &w, t0);
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
    /* A task that says how far it got (reconcile.found_status): one still going is read again
     * later; one the provider failed or cancelled is failed, with its answer; a status not in
     * the map is for an operator. */
    if (p->status_path) {
        cJSON *doc = res->body && !res->body_truncated
                         ? cJSON_ParseWithLength(res->body, res->body_len)
                         : NULL;
        int ts = doc ? prof_task_status(p, res->http_status, doc) : -1;
        cJSON_Delete(doc);
        if ((ts == TS_QUEUED || ts == TS_RUNNING) && !remote_id) {
            /* Still going, but with no id to follow it by (lookup.id / list.id not read): it
             * was accepted without one and "polled" for ever, its result never read. */
            struct verdict_write w = {ST_REVIEW, 0, RECON_FOUND_WITHOUT_ID,
                                      "a task was found still running but its id cannot be read "
                                      "(reconcile lookup.id / list.id): it cannot be followed; "
                                      "an operator must resolve it",
                                      NULL, NULL, -1, NULL, -1, 0, NULL, 0};
            write_verdict(db, c, &w, t0);
            return;
        }
        if (ts == TS_QUEUED || ts == TS_RUNNING) {
            /* Still going: followed by the poller from now on (and cancelled there when the
             * client cancelled), as a create answered in progress is. */
            struct verdict_write w = {ST_ACCEPTED, p->poll_interval_ms, "found_running",
                                      c->cancel_requested
                                          ? "canceled while unknown: the generation was found "
                                            "running; it is cancelled there and followed to its end"
                                          : NULL,
                                      NULL, remote_id, -1, NULL, -1, 0, p, 0};
            write_verdict(db, c, &w, t0);
            return;
        }
        if (ts == TS_FAILED || ts == TS_CANCELED || ts < 0) {
            /* (Cancelled by the provider: our own cancel is sent only once it is accepted.) */
            struct verdict_write w = {ts < 0 ? ST_REVIEW : ST_FAILED, 0, "found_failed",
                                      "found at the provider, which failed or cancelled it",
                                      res, remote_id, -1, NULL, -1, 0, NULL, 0};
            if (ts < 0) {
                w.outcome = RECON_FOUND_UNREADABLE;
                w.error = "a task was found but its status is not one the profile maps "
                          "(reconcile.found_status): an operator must resolve it";
                w.res = NULL;
            }
            write_verdict(db, c, &w, t0);
            return;
        }
    }
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
                              NULL, remote_id, -1, NULL, -1, 0, NULL, 0};
    if (w.next == ST_COMPLETED) {
        w.res = &fres;
        w.outputs_received = rs.received;
        w.usage = rs.usage;
        w.p = p; /* its outputs' archive plan */
        if (p->pricing.present && price_currency_fits(&p->pricing, c->currency))
            w.cost_micros = price_actual_raw(&p->pricing, (const char *)c->body, c->body_len,
                                             c->outputs_requested, rs.received, rs.usage,
                                             &w.unpriced);
        if (c->cancel_requested) {
            w.outcome = "found_after_cancel";
            w.error = "the cancel came too late: the task was found finished at the provider "
                      "(paid); its result is kept";
        }
    } else {
        w.outcome = RECON_FOUND_UNREADABLE;
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
    struct verdict_write w = {next, 0, "found", NULL, NULL, remote_id, -1, NULL, -1, 0, p, 0};
    if (next == ST_REVIEW) {
        w.outcome = RECON_FOUND_WITHOUT_ID;
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
    if (v == RV_ABSENT && !recon_same_reference(c->profile_stamp, p->profile_stamp)) {
        /* Nothing proven: looked for where this profile reads the reference, which is not
         * where the create recorded under another put it. Looked at again until the window
         * closes, then an operator decides. */
        LOG(LOG_WARN, "absence_unproven_profile_changed", LS("job_id", c->id),
            LS("provider", p->name), LS("recorded", c->profile_stamp),
            LS("current", p->profile_stamp));
        v = c->since_first_ms >= p->recovery_window_ms ? RV_REVIEW : RV_LATER;
        how = "profile_changed";
    }
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
        write_simple(db, c, ST_UNKNOWN,
                     recon_later_ms(p->reconcile_interval_ms, p->absent_grace_ms,
                                    c->since_ambiguous_ms),
                     "not_yet", NULL, t0);
}

struct match_ctx {
    const struct cfg_provider *p;
    const char *ref;
    int n, items, readable;
    const cJSON *found;
};

static void match_item(const cJSON *item, void *arg)
{
    struct match_ctx *m = arg;
    const char *v = jpath_string(m->p->list_match, item);
    m->items++;
    m->readable += v != NULL;
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

/* One reconcile on the call engine. Its calls (a task read, a lookup, the pages of a list one
 * after the other, or a resend) are made by the engine's threads; what they prove is written by a
 * reconciler thread, with its connection. */
enum recon_step { RS_ADOPT, RS_LOOKUP, RS_LIST, RS_RESEND, RS_RESUME };

struct recon_job {
    struct rq_item node;
    struct reconciler *r;
    const struct cfg_provider *p;
    struct store_claim c; /* owned */
    enum recon_step step;
    int window_closed;
    double t0;
    struct up_response res;   /* the last answer */
    struct up_response match; /* a list's one matching task, as a 200 answer */
    char *url;
    /* list_match: the window, the next page's cursor, the pages read, the matches counted (-1:
     * nothing is proven), and the one match's id */
    struct lookup_vars v;
    char *cursor, *remote;
    int page, total;
    int items, readable; /* list items seen, and those whose match path read as a string */
    double lease_end; /* clock_mono(): a page that could end after it is not asked for */
    /* a resend: its attempt, its engine slot and when its call ended */
    struct attempt *a;
    int slot;
    double t1;
    /* a resume: the record the cut stream left, and where its whole events end */
    char *rec;
    size_t rec_len; /* (a whole record's, start_resume) */
    struct resume_point pt;
};

struct reconciler {
    const struct cfg *cfg;
    struct wpool *pool;
    struct eng *eng;
    struct rq *results;
    atomic_int starved; /* the last claim found the engine full, or every provider at its cap */
    atomic_int *busy;   /* per provider slot: operations claimed and not yet written */
};

static void job_free(struct recon_job *j)
{
    atomic_fetch_sub(&j->r->busy[j->p - j->r->cfg->providers], 1);
    up_response_fini(&j->res);
    up_response_fini(&j->match);
    free(j->url);
    free(j->cursor);
    free(j->remote);
    free(j->rec);
    store_claim_fini(&j->c);
    free(j);
}

static void on_end(void *arg, struct up_response *res);

/* A GET of j->url with the operation's credential, on the slot its claim took (first) or on one
 * taken now for the next page of a list (a chain keeps its place). */
static void get(struct recon_job *j, int first)
{
    struct prov_call call = {.method = "GET", .url = j->url, .credential = j->c.credential};
    if (!first)
        eng_acquire_more(j->r->eng);
    prov_submit(j->r->eng, -1, j->p, &call, on_end, j);
}

/* Reads one page of the provider's list: counts the tasks carrying our reference (keeping the one
 * match) and says whether another page is to be read (recon_next_page). The count becomes -1
 * when nothing is proven: a page failed, or the pages ran past max_pages or the lease. */
static int list_page(struct recon_job *j, struct up_response *res)
{
    const struct cfg_provider *p = j->p;
    if (res->curl_code || res->http_status < 200 || res->http_status >= 300 ||
        res->body_truncated) {
        j->total = -1;
        return 0;
    }
    cJSON *doc = prov_id_doc(res->body, res->body_len);
    if (doc && !cJSON_IsArray(jpath_first(p->list_array, doc))) {
        LOG(LOG_WARN, "list_page_unreadable", LS("job_id", j->c.id), LS("provider", p->name),
            LI("page", j->page + 1), LS("note", "the page holds no list: nothing is proven"));
        cJSON_Delete(doc);
        j->total = -1;
        return 0;
    }
    struct match_ctx m = {p, j->c.id, 0, 0, 0, NULL};
    if (doc)
        jpath_each(p->list_items, doc, match_item, &m);
    j->total = doc ? j->total + m.n : -1;
    j->items += m.items;
    j->readable += m.readable;
    if (m.n == 1 && !j->match.body) { /* the matching task, not the whole list, is the result */
        j->match.body = cJSON_PrintUnformatted(m.found);
        j->match.body_len = j->match.body ? strlen(j->match.body) : 0;
        j->match.http_status = 200;
        const char *id = p->list_id ? prov_read_id(p->list_id, m.found) : NULL;
        j->remote = id ? strdup(id) : NULL;
    }
    const char *next = doc && p->list_next_cursor ? jpath_string(p->list_next_cursor, doc) : NULL;
    /* A cursor that is there but not a string (a page number, an object) is no "last page": read
     * as none, the first page alone would have proven absence. */
    const cJSON *cur = doc && p->list_next_cursor ? jpath_first(p->list_next_cursor, doc) : NULL;
    if (cur && !cJSON_IsNull(cur) && !cJSON_IsString(cur)) {
        LOG(LOG_WARN, "list_page_unreadable", LS("job_id", j->c.id), LS("provider", p->name),
            LI("page", j->page + 1),
            LS("note", "the next page's cursor is not a string: nothing is proven"));
        j->total = -1;
    }
    free(j->cursor);
    j->cursor = next && *next ? strdup(next) : NULL;
    if (next && *next && !j->cursor)
        j->total = -1; /* out of memory: a next page not read proves nothing (not "the last") */
    cJSON_Delete(doc);
    /* Every page must end within the lease, or what it proves could not be written: a search
     * that needs longer proves nothing this time (a later claim searches again, until the window
     * closes). */
    int past_lease = clock_mono() + p->total_timeout_ms / 1000.0 > j->lease_end;
    enum recon_page_step step =
        recon_next_page(j->total, j->cursor != NULL, ++j->page, p->list_max_pages, past_lease);
    if (step == RPS_UNPROVEN && j->total >= 0 && past_lease && j->page < p->list_max_pages)
        LOG(LOG_WARN, "list_search_unfinished", LS("job_id", j->c.id), LS("provider", p->name),
            LI("pages", j->page),
            LS("note", "the next page could end after the lease: nothing is proven"));
    if (step == RPS_UNPROVEN)
        j->total = -1;
    if (step == RPS_DONE && recon_search_proof(j->total, j->items, j->readable) < 0) {
        LOG(LOG_WARN, "list_match_unreadable", LS("job_id", j->c.id), LS("provider", p->name),
            LI("items", j->items),
            LS("note", "no listed item shows the match path: absence is not proven"));
        j->total = -1;
    }
    return step == RPS_NEXT;
}

/* A call of the job ended (on an engine thread, or at once when it could not be made): its
 * answer goes to a reconciler thread, which reads it. Nothing heavy runs here: a large list page
 * must not hold up the other calls of this engine thread. */
static void on_end(void *arg, struct up_response *res)
{
    struct recon_job *j = arg;
    j->t1 = clock_wall();
    j->res = *res;
    rq_push(j->r->results, &j->node);
}

/* Writes what the lookup or the list proves. */
static void write_look(struct db *db, struct recon_job *j)
{
    const struct cfg_provider *p = j->p;
    const struct store_claim *c = &j->c;
    int grace_passed = c->since_ambiguous_ms >= p->absent_grace_ms;
    enum recon_verdict verdict;
    const char *how = "undecided";
    if (j->step == RS_LIST) {
        if (j->total > 1)
            metrics_safety(MS_SUSPECTED_DUPLICATE);
        verdict = recon_list_verdict(j->total, j->window_closed, grace_passed);
        /* several tasks carry our reference (a task exists: `absent` is refused), or none was
         * found or the search failed with the window closed */
        how = j->total > 1 ? RECON_SEVERAL_MATCHES : "ambiguous_match";
    } else {
        const struct up_response *r = &j->res;
        int status = !r->curl_code && !r->body_truncated ? r->http_status : 0;
        int proves = recon_lookup_proves(p, status, r->body, r->body_len, c->id);
        if (proves < 0 && status >= 200 && status < 300)
            LOG(LOG_WARN, "lookup_not_ours", LS("job_id", c->id), LS("provider", p->name),
                LI("status", status),
                LS("note", "the lookup's answer does not carry our reference at "
                           "lookup.client_ref: nothing is proven"));
        else if (proves < 0 && status == 404)
            LOG(LOG_WARN, "lookup_absence_unproven", LS("job_id", c->id), LS("provider", p->name),
                LS("note", "a 404 whose body is not the provider's lookup.absent: nothing is "
                           "proven"));
        verdict = recon_lookup_verdict(proves, j->window_closed, grace_passed);
        cJSON *doc = verdict == RV_FOUND ? prov_id_doc(r->body, r->body_len) : NULL;
        const char *id = doc && p->lookup_id ? prov_read_id(p->lookup_id, doc) : NULL;
        j->remote = id ? strdup(id) : NULL;
        cJSON_Delete(doc);
    }
    if (verdict == RV_FOUND)
        found(p, db, c, j->step == RS_LIST ? &j->match : &j->res, j->remote, j->t0);
    else
        not_found(p, db, c, verdict, how, j->t0);
}

/* A verified webhook named a task by our client reference (or an operator resolved the job as
 * found): the task read by its id is adopted, its answer being the result, when it exists and —
 * for a webhook, where the profile says where — carries our reference. */
static void write_adopt(struct db *db, struct recon_job *j)
{
    const struct cfg_provider *p = j->p;
    const struct store_claim *c = &j->c;
    /* No hint: the id is the one our own create's stream gave (reconcile_one), ours. */
    const char *id = c->webhook_hint ? c->webhook_hint : c->remote_id;
    int answered = j->url && prov_task_answered(&j->res);
    int ok = answered;
    if (ok && p->task_client_ref && !c->operator_found && c->webhook_hint)
        ok = prov_task_is(p, &j->res, c->id);
    if (ok) {
        found(p, db, c, &j->res, id, j->t0);
        return;
    }
    enum op_state later = j->window_closed ? ST_REVIEW : ST_UNKNOWN;
    switch (recon_adopt_miss(c->operator_found, c->webhook_hint != NULL, answered, j->url != NULL,
                             p->reconcile == RECON_NONE, j->window_closed)) {
    case RAM_NAMED_UNREADABLE: /* the operator decides again, with what the provider said */
        write_simple(db, c, ST_REVIEW, 0, "named_unreadable", /* no task proven: not RECON_SAW */
                     "the task an operator named could not be read at the provider", j->t0);
        return;
    case RAM_STREAM_ID_UNREAD:
        write_simple(db, c, later, p->reconcile_interval_ms, "stream_id_unread",
                     "the generation the cut stream named could not be read at the provider",
                     j->t0);
        return;
    case RAM_NOT_OURS:
        write_simple(db, c, later, p->reconcile_interval_ms, "hint_unproven",
                     "a webhook named a task that could not be read as ours", j->t0);
        return;
    case RAM_SEARCH_FROM_NOW: {
        /* Not readable by its id where the profile's own strategy can still settle it (a lookup
         * or a list proves the task or its absence by the provider's word; a resend under the
         * provider's key cannot pay twice): the hint is dropped for it, the grace counted from
         * the provider's signed word. The verdict's outcome is a sight of the task (states.h):
         * should the search not settle it before the window closes, an `absent` is refused. */
        struct verdict_write w = {later, p->reconcile_interval_ms, RECON_SIGNED_UNREAD,
                                  "a signed webhook named a task this profile cannot read by its "
                                  "id: looked for by the reconcile strategy, its absent grace "
                                  "counted from the webhook",
                                  NULL, NULL, -1, NULL, -1, 0, NULL, 0};
        write_verdict_as(db, c, &w, j->t0, 1);
        return;
    }
    case RAM_HINT_REVIEW:
        /* The profile cannot read a task by its id, and nothing will look for it (strategy
         * none, or the window closed: no search runs in review): nothing can prove or
         * disprove it later. The hint is the only proof of a task the provider will not
         * deliver again: kept (`hint_unread`), and the job goes to review at once — an `absent`
         * is refused while it is there (jobs.c). Before, it was cleared as "unproven", and an
         * `absent` then sent the create again. */
        write_simple(db, c, ST_REVIEW, 0, "hint_unread",
                     "a signed webhook named a task of this job that this profile cannot read by "
                     "its id (kept on the job): an operator with the admin token resolves it found "
                     "with that id, or abandons it",
                     j->t0);
        break;
    case RAM_HINT_KEPT:
        /* The read failed (no answer, a 5xx, a 404 before the task is visible): the hint is
         * the only proof of a task the provider will not deliver again (its event is deduped).
         * It is kept for the next look — or for the operator, once in review. */
        write_simple(db, c, later, p->reconcile_interval_ms, "hint_unread",
                     "a webhook named a task whose read failed: read again later", j->t0);
        break;
    }
    CRASH_POINT("before_keep_hint");
    if (store_keep_hint(db, c, c->webhook_hint) < 0)
        LOG(LOG_WARN, "webhook_hint_dropped", LS("job_id", c->id));
}

/* A stream's whole answer (its terminal event without an error), written completed as if the
 * stream had never been cut: its usage settles the cost. outcome: how it was read. */
static void write_whole(struct db *db, struct recon_job *j, const struct up_response *whole,
                        const struct attempt_results *rs, const char *outcome)
{
    const struct cfg_provider *p = j->p;
    const struct store_claim *c = &j->c;
    struct verdict_write w = {ST_COMPLETED, 0, outcome, NULL, whole, c->remote_id, -1,
                              rs->usage, -1, 0, p, 0};
    if (p->pricing.present && price_currency_fits(&p->pricing, c->currency))
        w.cost_micros = price_actual_raw(&p->pricing, (const char *)c->body, c->body_len,
                                         c->outputs_requested, rs->received, rs->usage,
                                         &w.unpriced);
    write_verdict(db, c, &w, j->t0);
}

/* The record a cut stream left already holds its terminal event (RE_WHOLE: a replica died
 * after keeping the stream's last batch, before its result's write): concluded from it — the
 * events its clients were given, whole — with no call. Returns 0, writing nothing, when the
 * record does not read as a whole stream after all (then it is resumed or read back). */
static int write_record_whole(struct db *db, struct recon_job *j)
{
    struct up_response whole = {.http_status = 200,
                                .body = j->rec,
                                .body_len = j->rec_len,
                                .headers_json = "{\"content-type\":\"text/event-stream\"}"};
    struct attempt_results rs = {.received = -1};
    attempt_count_results(j->p, &whole, &rs);
    int ok = !rs.stream_cut;
    if (ok) {
        LOG(LOG_INFO, "stream_record_whole", LS("job_id", j->c.id), LS("provider", j->p->name),
            LS("note", "the kept record ends with its terminal event: concluded from it"));
        write_whole(db, j, &whole, &rs, "record_whole");
    }
    free(rs.usage);
    return ok;
}

/* A resumed stream's answer (RS_RESUME): the record joined with the events after its last whole
 * one. Whole: completed with it, its usage settling the cost, as if the stream had never been
 * cut — the record is the one event sequence every live client was given the start of. Cut
 * again after more events: still unknown, the longer record kept (the next claim resumes from
 * its end: a generation longer than a lease is read over several). Returns 0, writing nothing,
 * for anything else (a refusal, no stream, no new event, an error event): the response is then
 * read back whole, whose status decides. */
static int write_resumed(struct db *db, struct recon_job *j)
{
    const struct cfg_provider *p = j->p;
    const struct store_claim *c = &j->c;
    const struct up_response *res = &j->res;
    if (res->http_status < 200 || res->http_status >= 300 || !res->body_len ||
        res->body_truncated || !attempt_is_stream(p, res))
        return 0;
    struct up_response whole = *res;
    size_t n = 0;
    whole.body = resume_join(j->rec, &j->pt, res->body, res->body_len, &n);
    if (!whole.body)
        return 0;
    whole.body_len = n;
    if (n > p->max_response_bytes) {
        /* The record and the resume together pass the bound: never a result (a longer answer
         * never is); the response is read back whole, as when the resume itself was cut. */
        free(whole.body);
        j->res.body_truncated = 1;
        return 0;
    }
    struct attempt_results rs = {.received = -1};
    attempt_count_results(p, &whole, &rs);
    struct resume_point more;
    int progressed = rs.stream_cut && !rs.stream_error_type[0] &&
                     resume_point(p, (const char *)c->body, c->body_len, whole.body, n,
                                  c->remote_id, &more) == 1 &&
                     more.after > j->pt.after;
    int written = 1;
    if (!rs.stream_cut) {
        write_whole(db, j, &whole, &rs, "resumed");
    } else if (progressed) {
        struct verdict_write w = {j->window_closed ? ST_REVIEW : ST_UNKNOWN,
                                  p->reconcile_interval_ms, "resumed_partial",
                                  "the resumed stream was cut again before its terminal event; "
                                  "it is resumed from its last event",
                                  &whole, c->remote_id, -1, NULL, -1, 0, NULL, 1};
        write_verdict(db, c, &w, j->t0);
    } else {
        written = 0;
    }
    free(rs.usage);
    free(whole.body);
    return written;
}

/* Whether claim j's cut stream can be resumed (resume.h): its record is read under the lease
 * and, when its last whole event has a number, the resume's URL is set (step RS_RESUME). Not
 * after a cancel (the read back whole follows the response to its cancel) nor for a webhook's
 * or an operator's task. Returns 2 when the record is whole already (RE_WHOLE: j->rec holds it,
 * nothing to resume); 0 when it ends in a failure (RE_FAILED: read back whole, the provider's
 * status decides). */
static int start_resume(struct db *db, struct recon_job *j, const char *id)
{
    const struct cfg_provider *p = j->p;
    if (!p->resume_query || j->c.webhook_hint || j->c.cancel_requested)
        return 0;
    char *rec = NULL;
    size_t n = 0;
    int e = store_partial_record(db, &j->c, &rec, &n);
    if (e != STORE_OK && e != STORE_ENOTFOUND) /* (nothing kept: resumed from the start) */
        return 0;
    int end = resume_record_end(p, rec, n, id); /* (-1, out of memory: as RE_OPEN) */
    if (end == RE_WHOLE) {
        j->rec = rec;
        j->rec_len = n;
        return 2;
    }
    if (end == RE_FAILED) {
        free(rec);
        return 0;
    }
    if (resume_point(p, (const char *)j->c.body, j->c.body_len, rec, n, id, &j->pt) != 1 ||
        !(j->url = prov_resume_url(p, id, j->pt.after))) {
        free(rec);
        return 0;
    }
    j->rec = rec;
    j->step = RS_RESUME;
    return 1;
}

/* The resume's GET: its events are read until the stream ends or the lease would (a cut at the
 * limit keeps what arrived: the next claim goes on from there). */
static void get_resume(struct recon_job *j)
{
    double left_ms = (j->lease_end - clock_mono()) * 1000.0;
    struct prov_call call = {.method = "GET",
                             .url = j->url,
                             .credential = j->c.credential,
                             .total_timeout_ms = left_ms > 1000 ? (long)left_ms : 1000};
    prov_submit(j->r->eng, -1, j->p, &call, on_end, j);
}

/* The credential probe a resend's refusal asked for ended (on an engine thread). */
static void on_probe_end(void *arg, struct up_response *res)
{
    struct recon_job *j = arg;
    attempt_probed(j->a, res);
    rq_push(j->r->results, &j->node);
}

/* Whether a resume's answer is a 2xx event stream without an error event (a failed response
 * says so in its stream: it is read back whole, never resumed again). */
static int resumed_without_error(const struct cfg_provider *p, const struct up_response *res)
{
    if (!attempt_is_stream(p, res))
        return 0;
    struct sse_verdict v;
    if (sse_read((enum sse_format)p->stream_format, res->body, res->body_len, &v) < 0)
        return 1; /* unread (out of memory): later */
    int error = v.error;
    sse_verdict_fini(&v);
    return !error;
}

/* A reconciler thread reads what the job's call showed: the next list page is asked for, the
 * credential probe a resend's refusal asks for is made, or what was proved is written and the job
 * freed. */
static void write_job(struct rq_item *it, struct db *db)
{
    struct recon_job *j = (struct recon_job *)it;
    if (j->step == RS_LIST) {
        int more = list_page(j, &j->res);
        up_response_fini(&j->res);
        free(j->url);
        j->url = more ? page_url(j->p, &j->v, j->cursor) : NULL;
        if (more && j->url) {
            get(j, 0);
            return;
        }
        if (more)
            j->total = -1;
    }
    if (j->step == RS_RESEND) {
        const struct store_finish *f =
            attempt_ready(j->a, db, j->r->eng, &j->res, j->t1, on_probe_end, j);
        if (!f)
            return; /* the probe is in flight: on_probe_end queues the job again */
        int applied = 0;
        int e = store_finish(db, f, &applied);
        attempt_recorded(j->a, e, applied);
        eng_release(j->r->eng, j->slot); /* the outcome (and any trip) is written: room again */
    } else if (j->step == RS_RESUME) {
        if (write_resumed(db, j)) {
            /* resumed: written */
        } else if (resume_again_later(j->res.curl_code, j->res.http_status,
                                      resumed_without_error(j->p, &j->res),
                                      j->res.body_truncated)) {
            /* No new event, for now: in doubt still, its record kept (the finish leaves it),
             * resumed from its last event at the next turn — never read back whole while it can
             * be resumed, which would replace the events its clients were given. */
            struct verdict_write w = {j->window_closed ? ST_REVIEW : ST_UNKNOWN,
                                      j->p->reconcile_interval_ms, "resume_failed",
                                      "the stream's resume gave no new event (cut, refused for now "
                                      "or unreachable): it is resumed from its last event later",
                                      &j->res, j->c.remote_id, -1, NULL, -1, 0, NULL, 0};
            write_verdict(db, &j->c, &w, j->t0);
        } else {
            /* Refused: the response is read back whole. */
            up_response_fini(&j->res);
            memset(&j->res, 0, sizeof(j->res));
            free(j->url);
            j->url = prov_task_url(j->p, j->c.remote_id, j->c.id);
            j->step = RS_ADOPT;
            if (j->url) {
                get(j, 0);
                return;
            }
            write_adopt(db, j);
        }
    } else if (j->step == RS_ADOPT) {
        write_adopt(db, j);
    } else {
        write_look(db, j);
    }
    job_free(j);
}

/* A resend under the provider's idempotency key: the row moves to `sending` (fenced, and never
 * after a cancel), then the create is made as the dispatcher makes it. */
static void resend(struct db *db, struct recon_job *j)
{
    struct reconciler *r = j->r;
    struct up_xfer *x;
    /* What would stop the send on this replica, known before the move that counts a transport
     * attempt: a resend this replica cannot make must not use up the job's attempts (they
     * decide when it goes to review). Another replica, or this one once fixed, resends it. */
    char *secret = *j->c.credential ? secret_get(j->c.credential) : NULL;
    int unset = *j->c.credential && !secret;
    secret_free(secret);
    if (unset) {
        eng_release(r->eng, -1);
        write_simple(db, &j->c, ST_UNKNOWN, 60000, "not_configured",
                     "the provider's credential is not set on this replica (its variable unset, "
                     "its file unreadable or empty)",
                     clock_wall());
        job_free(j);
        return;
    }
    /* Its upload rebuilt from the archive store first, for the same reason: a store's outage
     * must not spend the attempts (nothing would leave without the parts). */
    char why[300] = "", *body = NULL;
    size_t len = 0;
    int rc = ups_expand(r->cfg, (const char *)j->c.body, j->c.body_len, &body, &len, why,
                        sizeof(why));
    if (rc == 0) {
        free(j->c.body);
        j->c.body = (unsigned char *)body;
        j->c.body_len = len;
        j->c.body_rebuilt = 1;
    } else if (rc != 1) {
        enum op_state next = upl_resend_blocked(rc);
        const char *reason = upl_unread_reason(rc);
        char msg[420];
        snprintf(msg, sizeof(msg),
                 "the upload could not be rebuilt from the archive store (%s: %s); nothing was "
                 "sent again",
                 reason, why);
        LOG(LOG_ERROR, "upload_unreadable", LS("job_id", j->c.id), LS("provider", j->p->name),
            LS("reason", reason), LS("error", why), LS("state", st_name(next)));
        eng_release(r->eng, -1);
        write_simple(db, &j->c, next,
                     j->p->reconcile_interval_ms > 5000 ? j->p->reconcile_interval_ms : 5000,
                     reason, msg, clock_wall());
        job_free(j);
        return;
    }
    double before = clock_mono(); /* the lease the move renews runs from here */
    if (store_reconcile_send(db, &j->c, r->cfg->lease_seconds, j->p->profile_stamp) !=
        STORE_OK) {
        eng_release(r->eng, -1); /* fenced, cancelled meanwhile, or unreachable: the next claim */
        job_free(j);
        return;
    }
    metrics_safety(MS_PROTECTED_RESEND);
    j->c.from_unknown = 1;
    /* A create counts against its provider's own limit too. */
    j->slot = (int)(j->p - r->cfg->providers);
    eng_assign(r->eng, j->slot);
    if (attempt_begin(r->cfg, db, &j->c, before, &j->a) < 0) {
        eng_release(r->eng, j->slot);
        job_free(j);
        return;
    }
    if (attempt_xfer(j->a, &x, &j->res) < 0) {
        eng_release(r->eng, j->slot);
        attempt_end(j->a, db, &j->res, clock_wall());
        memset(&j->res, 0, sizeof(j->res));
        job_free(j);
        return;
    }
    eng_submit_held(r->eng, j->slot, x, on_end, j);
}

/* Decides what to do with a claimed unknown operation (recon_plan) and starts it: a call on the
 * engine (its slot was taken with the claim), or a verdict written now. */
static void reconcile_one(const struct cfg *cfg, struct db *db, struct store_claim *c,
                          double claimed_mono, void *arg)
{
    struct reconciler *r = arg;
    double t0 = clock_wall();
    const struct cfg_provider *p = cfg_find_provider(cfg, c->provider, strlen(c->provider));
    struct recon_job *j = p ? calloc(1, sizeof(*j)) : NULL;
    if (!j) {
        eng_release(r->eng, -1);
        write_simple(db, c, ST_UNKNOWN, 60000, p ? "out_of_memory" : "not_configured",
                     p ? "out of memory" : "provider is not configured on this replica", t0);
        return;
    }
    /* The task to read by its id: a verified webhook's (or an operator's) hint, else the id a
     * synchronous provider's stream gave before it was cut, where the profile can read it. */
    const char *by_id = c->webhook_hint;
    if (!by_id && p->mode != CFG_MODE_ASYNC_POLL && p->task_path && c->remote_id &&
        *c->remote_id) /* "": the last attempt's stream named none */
        by_id = c->remote_id;
    struct recon_facts f = {
        .strategy = c->strategy,
        .can_look = (c->strategy == RECON_GET_BY_CLIENT_ID && p->lookup_path &&
                     p->reconcile == RECON_GET_BY_CLIENT_ID) ||
                    (c->strategy == RECON_LIST_MATCH && p->list_path &&
                     p->reconcile == RECON_LIST_MATCH),
        .cancel_requested = c->cancel_requested,
        .window_closed = c->since_first_ms >= p->recovery_window_ms,
        .budget_left = c->transport_attempts < p->max_attempts && c->since_first_ms < p->deadline_ms,
        .webhook_hint = by_id != NULL,
    };
    enum recon_plan plan = recon_plan(&f);
    if (plan == RP_WAIT || plan == RP_REVIEW) {
        free(j);
        eng_release(r->eng, -1);
        if (plan == RP_WAIT)
            write_simple(db, c, ST_UNKNOWN, (long)(p->recovery_window_ms - c->since_first_ms),
                         "waiting", NULL, t0);
        else
            write_simple(db, c, ST_REVIEW, 0,
                         c->cancel_requested ? "canceled_unknown" : "window_closed",
                         c->cancel_requested
                             ? "cancelled while its fate was unknown; it was never sent again "
                               "and cannot be looked up: an operator must resolve it"
                             : "no definite answer within the recovery window or the retry "
                               "budget: an operator must resolve it",
                         t0);
        return;
    }
    j->r = r;
    atomic_fetch_add(&r->busy[p - cfg->providers], 1);
    j->p = p;
    j->c = *c;
    memset(c, 0, sizeof(*c)); /* the job owns the claim now */
    j->window_closed = f.window_closed;
    j->t0 = t0;
    j->lease_end = claimed_mono + j->c.lease_remaining_s - LEASE_MARGIN_S;
    j->node.write = write_job;
    switch (plan) {
    case RP_ADOPT: {
        /* A cut stream the provider goes on generating is resumed after its last whole event
         * (concluded from its record when that is whole already); any other task is read
         * whole. */
        int resumable = start_resume(db, j, by_id); /* by_id: owned by j->c now */
        if (resumable == 2) {
            eng_release(r->eng, -1);
            if (!write_record_whole(db, j)) /* out of memory: never replaced, read later */
                write_simple(db, &j->c, ST_UNKNOWN, p->reconcile_interval_ms, "out_of_memory",
                             "out of memory", t0);
            job_free(j);
            return;
        }
        if (resumable) {
            get_resume(j);
            return;
        }
        j->step = RS_ADOPT;
        j->url = prov_task_url(p, by_id, j->c.id);
        get(j, 1);
        return;
    }
    case RP_LOOK:
        j->v.client_ref = j->c.id;
        if (p->reconcile == RECON_LIST_MATCH) {
            /* The window comes from the database's clock: a replica whose own clock is off must
             * not look in the wrong minutes, miss the task, and call it absent. */
            snprintf(j->v.since, sizeof(j->v.since), "%lld",
                     (long long)j->c.first_sent_db - LIST_SLACK_S);
            snprintf(j->v.until, sizeof(j->v.until), "%lld",
                     (long long)j->c.now_db + LIST_SLACK_S);
            j->step = RS_LIST;
            j->url = page_url(p, &j->v, NULL);
            if (p->list_max_pages <= 0) { /* no page may be read: nothing is proven */
                j->total = -1;
                eng_release(r->eng, -1);
                rq_push(r->results, &j->node);
                return;
            }
        } else {
            j->step = RS_LOOKUP;
            j->url = prov_url(p, p->lookup_path, lookup_var, &j->v, "lookup");
        }
        get(j, 1);
        return;
    case RP_RESEND:
        j->step = RS_RESEND;
        resend(db, j);
        return;
    default:
        return;
    }
}

/* Whether provider slot i has reconcile_max_inflight operations being reconciled here. */
static int provider_full(int i, void *arg)
{
    const struct reconciler *r = arg;
    return atomic_load(&r->busy[i]) >= r->cfg->reconcile_max_inflight;
}

/* Claims one unknown operation due for reconciling, of a provider configured here and not at its
 * cap, when the engine has room for its call. */
static int claim_with_room(struct db *db, const char *owner, int lease_seconds,
                           struct store_claim *out, void *arg)
{
    struct reconciler *r = arg;
    char providers[8192];
    if (!cfg_providers_literal(r->cfg, provider_full, r, providers, sizeof(providers)) ||
        eng_room(r->eng) <= 0) {
        atomic_store(&r->starved, 1);
        return STORE_ENOTFOUND; /* full: a call's end wakes a thread to claim again */
    }
    atomic_store(&r->starved, 0);
    /* The slot is taken once something was claimed (ENG_ROOM_THEN_TAKE in engine.h). */
    int e = store_reconcile_claim(db, owner, lease_seconds, providers, out);
    if (e == STORE_OK)
        eng_acquire_more(r->eng);
    return e;
}

static int recon_starved(void *arg)
{
    return atomic_load(&((struct reconciler *)arg)->starved);
}

/* A slot was given back (by any pool's call): a claim that found the engine full is made again. */
static void recon_room(void *arg)
{
    struct reconciler *r = arg;
    if (atomic_load(&r->starved))
        rq_kick(r->results);
}

static int write_results(struct db *db, void *arg)
{
    struct reconciler *r = arg;
    return rq_run(r->results, db, RESULTS_PER_TURN);
}

struct reconciler *recon_start(const struct cfg *cfg, struct eng *eng)
{
    struct reconciler *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->cfg = cfg;
    r->eng = eng;
    r->busy = calloc(cfg->n_providers ? cfg->n_providers : 1, sizeof(*r->busy));
    if (!r->busy || !(r->results = rq_new())) {
        free(r->busy);
        free(r);
        return NULL;
    }
    struct wpool_spec spec = {.name = "reconcile",
                              .claim_arg = claim_with_room,
                              .work = reconcile_one,
                              .idle_ms = IDLE_SLEEP_MS,
                              .error_ms = IDLE_SLEEP_MS,
                              .arg = r,
                              .chores = write_results,
                              .chores_fd = rq_fd(r->results),
                              .starved = recon_starved};
    eng_on_room(eng, recon_room, r);
    if (!(r->pool = wpool_start(cfg, cfg->reconcile_workers, &spec))) {
        eng_room_off(eng, r);
        rq_free(r->results);
        free(r->busy);
        free(r);
        return NULL;
    }
    return r;
}

void recon_quiesce(struct reconciler *r)
{
    if (r)
        wpool_quiesce(r->pool);
}

void recon_stop(struct reconciler *r)
{
    if (!r)
        return;
    wpool_stop(r->pool);
    eng_room_off(r->eng, r);
    rq_free(r->results);
    free(r->busy);
    free(r);
}
