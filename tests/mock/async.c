/*
 * idemgate-mock: the tasks of asynchronous job APIs (see async.h).
 *
 * The store is a hash table by id for lookups plus a ring of the tasks in creation order
 * for lists and for forgetting the oldest; both are guarded by store_lock.  State changes
 * happen under the lock and collect the webhook events they cause in an event_sink; the
 * events are queued (or delivered) only after the lock is released, so no network I/O ever
 * runs under it.
 */
#include "async.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/rand.h>

#include "tasks.h"

/* Hash buckets of the store; ASYNC_MAX_TASKS tasks keep the chains short. */
#define BUCKETS 65536u

/* Status reads a task waits for when "_mock.polls" does not say. */
#define DEFAULT_POLLS 2u

/* The failure message of a failed task when "_mock.error" does not say. */
#define DEFAULT_ERROR "mock failure"

/* Largest echoed input kept per task; a larger one is not echoed at all. */
#define ECHO_MAX 2048u

/* Longest webhook URL a create body may name; a longer one is ignored, like a missing one. */
#define WEBHOOK_URL_MAX 2048u

/* Most copies POST /_webhooks/send delivers at once (1 + duplicates). */
#define SEND_MAX_COPIES 10001u

/* Numeric task ids ("id_numeric") are this plus the task counter: 2^53. */
#define NUMERIC_ID_BASE 9007199254740992ULL

/* Most tasks GET /_tasks lists, and how many when the request does not say. */
#define TASKS_LIMIT_MAX 100000u
#define TASKS_LIMIT_DEFAULT 1000u

static pthread_mutex_t store_lock = PTHREAD_MUTEX_INITIALIZER;
static struct async_task *buckets[BUCKETS];
static struct async_task **ring; /* ASYNC_MAX_TASKS slots, oldest at ring_start */
static size_t ring_start, ring_count;
static unsigned long long task_counter;
static unsigned int uuid_salt;
static bool salt_ready;

/* Webhook events collected under the lock, handed on after it. */
struct event_sink {
    struct wh_event *head;
    struct wh_event **tail;
};

/* Makes an empty sink. */
static void sink_init(struct event_sink *s)
{
    s->head = NULL;
    s->tail = &s->head;
}

/* Appends ev (may be NULL when memory ran out) to s. */
static void sink_add(struct event_sink *s, struct wh_event *ev)
{
    if (ev == NULL)
        return;
    *s->tail = ev;
    s->tail = &ev->next;
}

/* Returns the wall-clock time as Unix seconds with a fractional part. */
static double now_unix(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- Helpers for the renderers ----------------------------------------------------- */

/* Returns the task's current view. */
struct async_view async_current(const struct async_task *t)
{
    return (struct async_view){t->state, t->step};
}

/* Returns the provider's label of view v. */
const char *async_label(const struct async_task *t, struct async_view v)
{
    switch (v.state) {
    case AS_SUCCEEDED:
        return t->kind->succeeded;
    case AS_FAILED:
        return t->kind->failed;
    case AS_CANCELED:
        return t->kind->canceled;
    case AS_PENDING:
        break;
    }
    return t->kind->steps[v.step < t->kind->n_steps ? v.step : t->kind->n_steps - 1].label;
}

/* Returns the gateway's canonical word for view v. */
static const char *canonical(const struct async_task *t, struct async_view v)
{
    static const char *const finals[] = {"", "succeeded", "failed", "canceled"};

    if (v.state != AS_PENDING)
        return finals[v.state];
    return async_is_queued(t, v) ? "queued" : "running";
}

/* Returns true when view v is queued (not running, not final). */
bool async_is_queued(const struct async_task *t, struct async_view v)
{
    return v.state == AS_PENDING && !t->kind->steps[v.step].running;
}

/* Returns how far the work is in view v, 0..100. */
unsigned int async_progress(const struct async_task *t, struct async_view v)
{
    unsigned int pct;

    if (v.state == AS_SUCCEEDED)
        return 100;
    if (async_is_queued(t, v) || t->polls_needed == 0)
        return 0;
    pct = (unsigned int)((unsigned long long)t->polls * 100u / t->polls_needed);
    return pct < 1 ? 1 : pct > 99 ? 99 : pct;
}

/* Writes the URL of output file i ("<base>/files/<id>-<i><ext>") into out. */
void async_output_url(const struct async_task *t, unsigned int i, char *out, size_t size)
{
    snprintf(out, size, "%s/files/%s-%u%s", mock_base_url(), t->short_id, i, t->ext);
}

/* Writes Unix time t as RFC 3339 UTC with milliseconds into out (at least 32 bytes). */
void async_rfc3339(double t, char *out, size_t size)
{
    time_t secs = (time_t)t;
    struct tm tm;
    char day[24];

    gmtime_r(&secs, &tm);
    strftime(day, sizeof(day), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, size, "%s.%03dZ", day, (int)((t - (double)secs) * 1000) % 1000);
}

/*
 * Returns the task object of t in its current state with the mock's counters "polls" and
 * "cancels" added, as status reads and lists answer it; NULL when memory ran out.
 */
cJSON *async_counted_object(const struct async_task *t)
{
    cJSON *o = t->kind->render_object(t, async_current(t));

    if (cJSON_IsObject(o)) {
        cJSON_AddNumberToObject(o, "polls", t->polls);
        cJSON_AddNumberToObject(o, "cancels", t->cancels);
    }
    return o;
}

/* Returns the task's echoed input as a new cJSON value, or a JSON null. */
cJSON *async_echo(const struct async_task *t)
{
    cJSON *v = t->echo ? cJSON_Parse(t->echo) : NULL;

    return v ? v : cJSON_CreateNull();
}

/* ---- The store --------------------------------------------------------------------- */

/* Returns the bucket of id (64-bit FNV-1a). */
static size_t bucket_of(const char *id)
{
    unsigned long long h = 1469598103934665603ULL;

    for (const char *c = id; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ULL;
    return (size_t)(h % BUCKETS);
}

/* Returns the task called id, deleted or not, or NULL.  The caller holds store_lock. */
static struct async_task *find_any(const char *id)
{
    struct async_task *t = buckets[bucket_of(id)];

    while (t && strcmp(t->id, id) != 0)
        t = t->hash_next;
    return t;
}

/* Frees one task that is no longer reachable. */
static void task_free(struct async_task *t)
{
    if (t == NULL)
        return;
    free(t->client_ref);
    free(t->scope);
    free(t->echo);
    free(t->error);
    free(t->webhook_url);
    free(t);
}

/* Unlinks t from its hash chain.  The caller holds store_lock. */
static void unhash(struct async_task *t)
{
    struct async_task **link = &buckets[bucket_of(t->id)];

    while (*link && *link != t)
        link = &(*link)->hash_next;
    if (*link)
        *link = t->hash_next;
}

/*
 * Stores t, forgetting the oldest task when the store is full.  The caller holds
 * store_lock.  Returns false when memory ran out (t is then not stored).
 */
static bool store_add(struct async_task *t)
{
    size_t b = bucket_of(t->id);

    if (ring == NULL)
        ring = calloc(ASYNC_MAX_TASKS, sizeof(*ring));
    if (ring == NULL)
        return false;
    if (ring_count == ASYNC_MAX_TASKS) {
        struct async_task *old = ring[ring_start];

        unhash(old);
        task_free(old);
        ring_start = (ring_start + 1) % ASYNC_MAX_TASKS;
        ring_count--;
    }
    ring[(ring_start + ring_count) % ASYNC_MAX_TASKS] = t;
    ring_count++;
    t->hash_next = buckets[b];
    buckets[b] = t;
    return true;
}

/* Returns the i-th newest task (0 = newest).  The caller holds store_lock; i < ring_count. */
static struct async_task *newest(size_t i)
{
    return ring[(ring_start + ring_count - 1 - i) % ASYNC_MAX_TASKS];
}

/* Forgets every task (POST /_reset); the id counter keeps counting. */
void async_reset(void)
{
    pthread_mutex_lock(&store_lock);
    for (size_t i = 0; i < ring_count; i++)
        task_free(ring[(ring_start + i) % ASYNC_MAX_TASKS]);
    free(ring);
    ring = NULL;
    ring_start = ring_count = 0;
    memset(buckets, 0, sizeof(buckets));
    pthread_mutex_unlock(&store_lock);
}

/* ---- Course of a task and its webhooks --------------------------------------------- */

/*
 * Makes the webhook event that reports view v of t to url, delivered once, with the event
 * id "msg_<task>_<label>" that every copy and resend of it shares.  Returns NULL when memory
 * ran out.  The caller holds store_lock.
 */
static struct wh_event *make_event(const struct async_task *t, struct async_view v, const char *url)
{
    char event_id[WH_EVENT_ID_MAX];
    const char *label = async_label(t, v);
    cJSON *doc;
    char *body;

    snprintf(event_id, sizeof(event_id), "msg_%s_%s", t->id, label);
    doc = t->kind->render_webhook(t, v, event_id);
    body = doc ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    return wh_event_new(t->id, event_id, label, url, body, t->kind->scheme);
}

/*
 * Adds to sink the webhooks that entering view v causes, as t's controls ask: the event
 * with its duplicates, and after a final one, when "reorder" is set, a stale event of the
 * last label before the end.  The caller holds store_lock.
 */
static void emit(const struct async_task *t, struct async_view v, struct event_sink *sink)
{
    bool final = v.state != AS_PENDING;
    unsigned int mask = final ? EV_FINAL : v.step == 0 ? EV_CREATED : EV_STEP;
    struct wh_event *ev;

    if (t->webhook_url == NULL || !(t->events & mask))
        return;
    ev = make_event(t, v, t->webhook_url);
    if (ev) {
        ev->copies = 1 + t->wh.duplicates;
        ev->bad_signature = t->wh.bad_signature;
        ev->delay_ms = final ? t->wh.delay_ms : 0;
    }
    sink_add(sink, ev);
    if (final && t->wh.reorder) {
        struct async_view stale = {AS_PENDING, (unsigned int)t->kind->n_steps - 1};

        ev = make_event(t, stale, t->webhook_url);
        if (ev) {
            ev->bad_signature = t->wh.bad_signature;
            ev->delay_ms = t->wh.delay_ms;
        }
        sink_add(sink, ev);
    }
}

/*
 * Moves t forward to view target, adding the webhooks of every state it enters to sink.
 * A final state never changes, and a pending task never goes back a step.  A task that
 * ends by itself passes through the labels it skipped, so per-state webhooks (Luma) see
 * each; a cancel ends it where it is.  The caller holds store_lock.
 */
static void move_to(struct async_task *t, struct async_view target, struct event_sink *sink)
{
    double now = now_unix();

    if (t->state != AS_PENDING)
        return;
    while (t->step + 1 < t->kind->n_steps &&
           (target.state == AS_PENDING ? t->step < target.step : target.state != AS_CANCELED)) {
        t->step++;
        if (t->started == 0 && t->kind->steps[t->step].running)
            t->started = now;
        emit(t, async_current(t), sink);
    }
    if (target.state == AS_PENDING)
        return;
    t->state = target.state;
    t->completed = now;
    /* A task canceled while queued never started. */
    if (t->started == 0 && target.state != AS_CANCELED)
        t->started = now;
    emit(t, async_current(t), sink);
}

/* The final view a task reaches by itself. */
static struct async_view outcome_view(const struct async_task *t)
{
    return (struct async_view){t->fail ? AS_FAILED : AS_SUCCEEDED, 0};
}

/*
 * The view after t->polls status reads: final once polls_needed are done; before that the
 * labels are spread so that the last read before the end shows the last label.
 */
static struct async_view view_after_polls(const struct async_task *t)
{
    unsigned int last = (unsigned int)t->kind->n_steps - 1, back;

    if (t->polls >= t->polls_needed)
        return outcome_view(t);
    back = t->polls_needed - 1 - t->polls;
    return (struct async_view){AS_PENDING, back >= last ? 0 : last - back};
}

/* Timer callback: the task called id ends by itself ("_mock.webhook.auto_complete_ms"). */
static void auto_complete(const char *id)
{
    struct event_sink sink;
    struct async_task *t;

    sink_init(&sink);
    pthread_mutex_lock(&store_lock);
    t = find_any(id);
    if (t && !t->deleted)
        move_to(t, outcome_view(t), &sink);
    pthread_mutex_unlock(&store_lock);
    webhooks_enqueue(sink.head);
}

/*
 * Ends the task now (as its outcome says) and delivers, on the calling thread, the held
 * creation events followed by the events of its ending; takes ownership of held.  For a
 * create with "_mock.webhook.early", before its answer is written.
 */
void async_finish_early(const char *task_id, struct wh_event *held)
{
    struct event_sink sink;
    struct async_task *t;

    sink_init(&sink);
    sink_add(&sink, held);
    while (*sink.tail)
        sink.tail = &(*sink.tail)->next;
    pthread_mutex_lock(&store_lock);
    t = find_any(task_id);
    if (t)
        move_to(t, outcome_view(t), &sink);
    pthread_mutex_unlock(&store_lock);
    webhooks_deliver_now(sink.head, NULL, 0);
}

/* ---- Creating a task --------------------------------------------------------------- */

/*
 * Expands a template such as "{owner}/{name}" with the captures of m into out.  Returns
 * false when a capture is missing or the result does not fit.
 */
static bool expand(const char *tpl, const struct route_match *m, char *out, size_t size)
{
    size_t n = 0;

    while (*tpl) {
        if (*tpl == '{') {
            const char *close = strchr(tpl, '}');
            char name[32], value[ASYNC_ID_MAX];
            size_t len;

            if (close == NULL || (size_t)(close - tpl - 1) >= sizeof(name))
                return false;
            memcpy(name, tpl + 1, (size_t)(close - tpl - 1));
            name[close - tpl - 1] = '\0';
            if (!route_capture(m, name, value, sizeof(value)))
                return false;
            len = strlen(value);
            if (n + len >= size)
                return false;
            memcpy(out + n, value, len);
            n += len;
            tpl = close + 1;
        } else {
            if (n + 1 >= size)
                return false;
            out[n++] = *tpl++;
        }
    }
    out[n] = '\0';
    return true;
}

/* Writes a new task's id into t->id and t->short_id.  The caller holds store_lock. */
static void name_task(struct async_task *t)
{
    const struct async_kind *k = t->kind;

    t->number = ++task_counter;
    if (!salt_ready) {
        /* The salt only makes uuid-like ids look distinct between mock processes. */
        if (RAND_bytes((unsigned char *)&uuid_salt, sizeof(uuid_salt)) != 1)
            uuid_salt = (unsigned int)time(NULL);
        salt_ready = true;
    }
    if (t->id_numeric)
        /* Above 2^53, where a double cannot hold every integer: 2^53 + 1 is the first. */
        snprintf(t->short_id, sizeof(t->short_id), "%llu", NUMERIC_ID_BASE + t->number);
    else if (k->id_prefix)
        snprintf(t->short_id, sizeof(t->short_id), "%s%llu", k->id_prefix, t->number);
    else
        snprintf(t->short_id, sizeof(t->short_id), "%08x-0000-4000-8000-%012llx", uuid_salt,
                 t->number);
    if (k->operation_names && t->scope)
        snprintf(t->id, sizeof(t->id), "%s/operations/%s", t->scope, t->short_id);
    else
        memcpy(t->id, t->short_id, sizeof(t->short_id));
}

/* Returns a heap JSON text of the input the task echoes, or NULL (none, too big, no memory). */
static char *make_echo(const struct async_kind *k, const cJSON *doc)
{
    cJSON *copy;
    char *text;

    if (k->echo_member == NULL)
        return NULL;
    if (k->echo_member[0] != '\0') {
        const cJSON *member = cJSON_GetObjectItemCaseSensitive(doc, k->echo_member);

        copy = member ? cJSON_Duplicate(member, 1) : NULL;
    } else {
        copy = cJSON_Duplicate(doc, 1);
        cJSON_DeleteItemFromObjectCaseSensitive(copy, "_mock");
    }
    text = copy ? cJSON_PrintUnformatted(copy) : NULL;
    cJSON_Delete(copy);
    if (text && strlen(text) > ECHO_MAX) {
        free(text);
        text = NULL;
    }
    return text;
}

/* Returns the create's webhook URL (the provider's own field, else _mock.webhook.url). */
static const char *webhook_url(const struct async_create_args *a)
{
    const struct async_kind *k = a->p->async;
    const char *url = NULL;

    if (!k->webhooks)
        return NULL;
    if (k->webhook_member) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(a->doc, k->webhook_member);

        url = cJSON_IsString(v) ? v->valuestring : NULL;
    } else if (k->webhook_query) {
        url = MHD_lookup_connection_value(a->req->conn, MHD_GET_ARGUMENT_KIND, k->webhook_query);
    }
    if (url && strlen(url) > WEBHOOK_URL_MAX) {
        fprintf(stderr, "idemgate-mock: webhook URL over %u bytes ignored\n", WEBHOOK_URL_MAX);
        url = NULL;
    }
    if ((url == NULL || *url == '\0') && (a->ctrl->set & CTRL_WEBHOOK) && a->ctrl->webhook.url[0])
        url = a->ctrl->webhook.url;
    return url && *url ? url : NULL;
}

/* The events Replicate's "webhook_events_filter" asks for, or the provider's default. */
static unsigned int webhook_events(const struct async_kind *k, const cJSON *doc)
{
    static const struct {
        const char *name;
        unsigned int bit;
    } names[] = {
        {"start", EV_CREATED}, {"output", EV_STEP}, {"logs", EV_STEP}, {"completed", EV_FINAL}};
    const cJSON *filter = cJSON_GetObjectItemCaseSensitive(doc, "webhook_events_filter");
    const cJSON *item;
    unsigned int events = 0;

    if (!k->events_filter || !cJSON_IsArray(filter))
        return k->events;
    cJSON_ArrayForEach(item, filter)
    {
        for (size_t i = 0; cJSON_IsString(item) && i < sizeof(names) / sizeof(names[0]); i++)
            if (strcmp(item->valuestring, names[i].name) == 0)
                events |= names[i].bit;
    }
    return events;
}

/* Returns a heap copy of s (NULL for NULL); *ok turns false when memory ran out. */
static char *dup_or_null(const char *s, bool *ok)
{
    char *copy = s ? strdup(s) : NULL;

    if (s && copy == NULL)
        *ok = false;
    return copy;
}

/*
 * Builds a task from the create's arguments, not yet named or stored.  Returns NULL when
 * memory ran out.
 */
static struct async_task *task_new(const struct async_create_args *a)
{
    const struct async_kind *k = a->p->async;
    const struct mock_controls *c = a->ctrl;
    struct async_task *t = calloc(1, sizeof(*t));
    char scope[ASYNC_ID_MAX];
    bool ok = true;
    size_t url_len = strlen(a->req->url);

    if (t == NULL)
        return NULL;
    t->p = a->p;
    t->kind = k;
    t->seq = a->seq;
    t->created = now_unix();
    t->visible_at = t->created;
    if (c->set & CTRL_VISIBLE_AFTER)
        t->visible_at += c->visible_after_ms / 1000.0;
    t->client_ref = dup_or_null(a->client_ref, &ok);
    if (k->scope_template && expand(k->scope_template, a->m, scope, sizeof(scope))) {
        char *cut = scope;
        for (unsigned int n = 0; k->scope_segments && cut && n < k->scope_segments; n++)
            cut = strchr(cut + (n > 0), '/');
        if (cut && k->scope_segments)
            *cut = '\0';
        t->scope = dup_or_null(scope, &ok);
    }
    t->echo = make_echo(k, a->doc);
    if (k->output_ext)
        snprintf(t->ext, sizeof(t->ext), "%s", k->output_ext);
    else
        snprintf(t->ext, sizeof(t->ext), "%s",
                 url_len >= 5 && strcmp(a->req->url + url_len - 5, "video") == 0 ? ".mp4" : ".png");
    t->polls_needed = (c->set & CTRL_POLLS) ? c->polls : DEFAULT_POLLS;
    t->poll_delay_ms = (c->set & CTRL_POLL_DELAY) ? c->poll_delay_ms : 0;
    t->cancel_fails = (c->set & CTRL_CANCEL_FAILS) ? c->cancel_fails : 0;
    t->reads_fail = (c->set & CTRL_READS_FAIL) ? c->reads_fail_after_cancel : 0;
    t->fail = (c->set & CTRL_OUTCOME) && c->fail;
    t->error = dup_or_null((c->set & CTRL_ERROR) ? c->error : DEFAULT_ERROR, &ok);
    t->outputs = (c->set & CTRL_OUTPUTS) ? c->outputs : (c->set & CTRL_N_OUT) ? c->n_out : 1;
    t->filtered = (c->set & CTRL_FILTERED) ? c->filtered : 0;
    t->state = AS_PENDING;
    t->webhook_url = dup_or_null(webhook_url(a), &ok);
    t->events = webhook_events(k, a->doc);
    if (c->set & CTRL_WEBHOOK)
        t->wh = c->webhook;
    t->id_numeric = k->id_controls && (c->set & CTRL_ID_NUMERIC) && c->id_numeric;
    t->id_missing = k->id_controls && (c->set & CTRL_ID_MISSING) && c->id_missing;
    if (!ok) {
        task_free(t);
        return NULL;
    }
    return t;
}

/*
 * Makes the task of an asynchronous create and returns the create's body (NULL when memory
 * ran out).  With keep, the task is stored, task_id (ASYNC_ID_MAX) receives its id,
 * *events the webhooks the creation itself sends (the caller queues or holds them), and
 * the auto-complete timer starts.  Without keep, task_id is empty and nothing is stored.
 */
cJSON *async_create(const struct async_create_args *a, char *task_id, struct wh_event **events)
{
    struct async_task *t = task_new(a);
    struct event_sink sink;
    cJSON *body;
    bool stored = false;

    task_id[0] = '\0';
    *events = NULL;
    if (t == NULL)
        return NULL;
    sink_init(&sink);
    pthread_mutex_lock(&store_lock);
    name_task(t);
    body = t->kind->render_create(t);
    if (a->keep && body) {
        stored = store_add(t);
        if (stored) {
            memcpy(task_id, t->id, ASYNC_ID_MAX);
            emit(t, async_current(t), &sink);
            if (t->polls_needed == 0)
                move_to(t, outcome_view(t), &sink);
        }
    }
    pthread_mutex_unlock(&store_lock);
    if (!stored) {
        task_free(t);
        if (a->keep) {
            cJSON_Delete(body);
            return NULL;
        }
        return body;
    }
    if (a->ctrl->set & CTRL_WEBHOOK && a->ctrl->webhook.has_auto_complete &&
        !webhooks_after(a->ctrl->webhook.auto_complete_ms, auto_complete, task_id))
        fprintf(stderr, "idemgate-mock: auto-complete timer of %s not set\n", task_id);
    *events = sink.head;
    return body;
}

/*
 * Makes a task of personality p that no create made (POST /_tasks/seed): created now, with
 * the client reference client_ref, the default course (DEFAULT_POLLS status reads, then
 * succeeded with one output), no scope and no webhooks.  Writes its id into task_id
 * (ASYNC_ID_MAX).  Returns false when memory ran out.
 */
bool async_seed(const struct mock_personality *p, const char *client_ref, char *task_id)
{
    struct async_task *t = calloc(1, sizeof(*t));
    bool ok = t != NULL;

    if (t == NULL)
        return false;
    t->p = p;
    t->kind = p->async;
    t->created = now_unix();
    t->visible_at = t->created;
    t->client_ref = dup_or_null(client_ref, &ok);
    snprintf(t->ext, sizeof(t->ext), "%s", t->kind->output_ext ? t->kind->output_ext : ".png");
    t->polls_needed = DEFAULT_POLLS;
    t->error = dup_or_null(DEFAULT_ERROR, &ok);
    t->outputs = 1;
    t->state = AS_PENDING;
    t->events = t->kind->events;
    if (!ok) {
        task_free(t);
        return false;
    }
    pthread_mutex_lock(&store_lock);
    name_task(t);
    ok = store_add(t);
    if (ok)
        memcpy(task_id, t->id, ASYNC_ID_MAX);
    pthread_mutex_unlock(&store_lock);
    if (!ok)
        task_free(t);
    return ok;
}

/*
 * Returns an error text when controls ask for something the personality cannot do (a
 * webhook URL for a provider without webhooks), else NULL.
 */
const char *async_check_controls(const struct mock_personality *p, const struct mock_controls *c)
{
    if ((c->set & CTRL_WEBHOOK) && c->webhook.url[0] && !p->async->webhooks)
        return "this provider sends no webhooks, so webhook.url cannot be used";
    if (!p->async->id_controls && (((c->set & CTRL_ID_NUMERIC) && c->id_numeric) ||
                                   ((c->set & CTRL_ID_MISSING) && c->id_missing)))
        return "id_numeric and id_missing apply to keyed-async only";
    return NULL;
}

/* ---- Provider routes --------------------------------------------------------------- */

/* Sends the provider's error body with the given status. */
static enum MHD_Result send_error(struct mock_request *req, const struct async_kind *k,
                                  unsigned int status, const char *code, const char *message)
{
    struct mock_reply r;
    enum MHD_Result ret;

    reply_init(&r);
    k->render_error(&r, status, code, message);
    ret = r.body ? reply_send(req, &r) : MHD_NO;
    reply_free(&r);
    return ret;
}

/*
 * Reads the task id of a status, result or cancel route into id (ASYNC_ID_MAX): the {id}
 * capture, or the body member the provider names (Vertex's operationName).  Returns false
 * when it is missing.
 */
static bool request_task_id(struct mock_request *req, const struct async_kind *k,
                            const struct route_match *m, char *id)
{
    cJSON *doc;
    const cJSON *v;
    bool ok;

    if (k->id_body_member == NULL)
        return route_capture(m, "id", id, ASYNC_ID_MAX);
    doc = cJSON_ParseWithLength(req->body, req->body_len);
    v = cJSON_GetObjectItemCaseSensitive(doc, k->id_body_member);
    ok = cJSON_IsString(v) && strlen(v->valuestring) < ASYNC_ID_MAX;
    if (ok)
        strcpy(id, v->valuestring);
    cJSON_Delete(doc);
    return ok;
}

/*
 * Returns the live task of personality p called id, or NULL when there is none, it was
 * deleted, it is not visible yet ("visible_after_ms"), or the route's scope (fal's model,
 * Vertex's resource) is not the task's: a status read of the wrong model finds nothing, as
 * it would at the provider.  The caller holds store_lock.
 */
static struct async_task *find_live(const struct mock_personality *p, const struct route_match *m,
                                    const char *id)
{
    struct async_task *t = find_any(id);
    char scope[ASYNC_ID_MAX];

    if (t == NULL || t->p != p || t->deleted || t->visible_at > now_unix())
        return NULL;
    if (p->async->scope_template && expand(p->async->scope_template, m, scope, sizeof(scope)) &&
        (t->scope == NULL || strcmp(t->scope, scope) != 0))
        return NULL;
    return t;
}

/* The three operations on one task that the provider routes perform. */
enum task_op {
    OP_POLL,
    OP_RESULT,
    OP_CANCEL,
};

/*
 * Runs op on the task the request names and answers it: a status read counts a poll and
 * advances the task, a cancel counts and cancels it, a result read changes nothing.
 */
static enum MHD_Result task_route(struct mock_request *req, const struct mock_personality *p,
                                  const struct route_match *m, enum task_op op)
{
    const struct async_kind *k = p->async;
    struct event_sink sink;
    struct async_task *t;
    struct mock_reply r;
    char id[ASYNC_ID_MAX];
    enum MHD_Result ret;
    unsigned int delay_ms = 0;

    if (!request_task_id(req, k, m, id))
        return send_error(req, k, MHD_HTTP_BAD_REQUEST, "invalid_argument",
                          "the request names no task");
    sink_init(&sink);
    reply_init(&r);
    pthread_mutex_lock(&store_lock);
    t = find_live(p, m, id);
    struct async_task *any = find_any(id);
    if (op == OP_POLL && any && any->p == p && any->cancels > 0 && any->state == AS_CANCELED &&
        any->reads_fail > 0) {
        any->reads_fail--; /* a read after the cancel that fails in passing */
        pthread_mutex_unlock(&store_lock);
        return send_error(req, k, MHD_HTTP_SERVICE_UNAVAILABLE, "unavailable",
                          "mock: the status read failed");
    }
    if (t && op == OP_POLL) {
        t->polls++;
        delay_ms = t->poll_delay_ms;
        move_to(t, view_after_polls(t), &sink);
        reply_set_json(&r, MHD_HTTP_OK, async_counted_object(t));
        if (k->poll_hint_header) {
            r.extra_header = k->poll_hint_header;
            snprintf(r.extra_value, sizeof(r.extra_value), "%s", k->poll_hint_value);
        }
    } else if (t && op == OP_RESULT) {
        k->render_result(t, &r);
    } else if (t && t->cancel_fails > 0) {
        t->cancel_fails--; /* counted as a cancel, cancels nothing */
        t->cancels++;
        reply_set_error(&r, MHD_HTTP_SERVICE_UNAVAILABLE, "mock: the cancel failed", "mock_error",
                        "mock_503");
    } else if (t) {
        bool was_final = t->state != AS_PENDING;

        t->cancels++;
        move_to(t, (struct async_view){AS_CANCELED, 0}, &sink);
        k->render_cancel(t, was_final, &r);
        if (k->cancel_deletes)
            t->deleted = true;
    }
    pthread_mutex_unlock(&store_lock);
    webhooks_enqueue(sink.head);
    /* The state was read above: a webhook sent meanwhile changes the task, not this answer. */
    if (delay_ms && !mock_sleep_ms(req, delay_ms, true)) {
        reply_free(&r);
        return MHD_NO;
    }

    if (t == NULL)
        ret = send_error(req, k, MHD_HTTP_NOT_FOUND, "not_found", "no such task");
    else if (r.status != 0 && (r.body || r.body_len == 0))
        ret = reply_send(req, &r);
    else
        ret = MHD_NO;
    reply_free(&r);
    return ret;
}

/* Status read: counts a poll, advances the task and answers its object. */
enum MHD_Result async_handle_poll(struct mock_request *req, const struct mock_personality *p,
                                  const struct route_match *m)
{
    return task_route(req, p, m, OP_POLL);
}

/* Result route: the task's result or content, without counting a poll. */
enum MHD_Result async_handle_result(struct mock_request *req, const struct mock_personality *p,
                                    const struct route_match *m)
{
    return task_route(req, p, m, OP_RESULT);
}

/* Cancel route: counts a cancel and cancels the task unless it has ended. */
enum MHD_Result async_handle_cancel(struct mock_request *req, const struct mock_personality *p,
                                    const struct route_match *m)
{
    return task_route(req, p, m, OP_CANCEL);
}

/* Returns true when t was created inside window w (whole seconds, inclusive). */
static bool in_window(const struct async_task *t, const struct tasks_window *w)
{
    long long second = (long long)t->created;

    return (!w->has_since || second >= w->since) && (!w->has_until || second <= w->until);
}

/*
 * List route: one page of the personality's tasks, newest first (/_config "list" settings
 * apply).  A page ends below the task counter of its last task, so tasks made meanwhile never
 * shift the next page: its cursor is "a<number>".
 */
enum MHD_Result async_handle_list(struct mock_request *req, const struct mock_personality *p,
                                  const struct route_match *m)
{
    struct tasks_window w;
    enum MHD_Result ret;
    cJSON *items, *doc;
    size_t listed = 0;
    unsigned long long before = 0, last = 0;
    bool ok, more = false;
    double now = now_unix();
    char next[TASKS_CURSOR_MAX] = "";

    (void)m;
    if (tasks_list_refused(req, &w, &ret))
        return ret;
    if (w.cursor && (!tasks_cursor_parse(w.cursor, 'a', &before, NULL) || before == 0))
        return tasks_reply_bad_cursor(req);
    items = cJSON_CreateArray();
    ok = items != NULL;
    pthread_mutex_lock(&store_lock);
    for (size_t i = 0; ok && i < ring_count; i++) {
        const struct async_task *t = newest(i);
        cJSON *item;

        if (t->p != p || t->deleted || t->visible_at > now || !in_window(t, &w) ||
            (before && t->number >= before))
            continue;
        if (listed == w.limit) {
            more = true;
            break;
        }
        item = async_counted_object(t);
        ok = item != NULL && cJSON_AddItemToArray(items, item);
        last = t->number;
        listed++;
    }
    pthread_mutex_unlock(&store_lock);
    if (more)
        snprintf(next, sizeof(next), "a%llu", last);
    doc = ok ? p->async->render_list(items, more ? next : NULL) : NULL;
    if (!ok)
        cJSON_Delete(items);
    if (doc == NULL)
        return reply_error(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory", "mock_error",
                           "oom");
    return reply_json(req, MHD_HTTP_OK, doc);
}

/* ---- Admin routes ------------------------------------------------------------------ */

/* Adds s to obj under name, or a JSON null when s is NULL. */
static void add_string_or_null(cJSON *obj, const char *name, const char *s)
{
    if (s)
        cJSON_AddStringToObject(obj, name, s);
    else
        cJSON_AddNullToObject(obj, name);
}

/* The mock's own object of task t, with its counters.  The caller holds store_lock. */
static cJSON *task_to_json(const struct async_task *t)
{
    struct async_view v = async_current(t);
    cJSON *o = cJSON_CreateObject();

    if (o == NULL)
        return NULL;
    cJSON_AddStringToObject(o, "id", t->id);
    cJSON_AddStringToObject(o, "object", "task");
    cJSON_AddStringToObject(o, "provider", t->p->name);
    cJSON_AddNumberToObject(o, "seq", (double)t->seq);
    add_string_or_null(o, "client_ref", t->client_ref);
    cJSON_AddNumberToObject(o, "created", t->created);
    cJSON_AddStringToObject(o, "status", canonical(t, v));
    cJSON_AddStringToObject(o, "provider_status", async_label(t, v));
    cJSON_AddNumberToObject(o, "polls", t->polls);
    cJSON_AddNumberToObject(o, "polls_needed", t->polls_needed);
    cJSON_AddNumberToObject(o, "cancels", t->cancels);
    cJSON_AddStringToObject(o, "outcome", t->fail ? "failed" : "succeeded");
    cJSON_AddNumberToObject(o, "outputs", t->outputs);
    add_string_or_null(o, "error", t->fail ? t->error : NULL);
    add_string_or_null(o, "scope", t->scope);
    add_string_or_null(o, "webhook_url", t->webhook_url);
    cJSON_AddBoolToObject(o, "deleted", t->deleted);
    return o;
}

/*
 * GET /_tasks[?provider=&client_ref=&limit=] lists tasks newest first as {"object": "list",
 * "data": [...]}; GET /_tasks/{id} answers one task or 404.
 */
enum MHD_Result async_handle_tasks(struct mock_request *req)
{
    const char *id = req->url + strlen("/_tasks");
    const char *provider =
        MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "provider");
    const char *ref = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "client_ref");
    const char *limit_text = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "limit");
    unsigned long limit = limit_text ? strtoul(limit_text, NULL, 10) : TASKS_LIMIT_DEFAULT;
    cJSON *doc = NULL, *data;
    bool ok = true;

    if (*id == '/') {
        const struct async_task *t;

        pthread_mutex_lock(&store_lock);
        t = find_any(id + 1);
        doc = t ? task_to_json(t) : NULL;
        pthread_mutex_unlock(&store_lock);
        if (t == NULL)
            return reply_error(req, MHD_HTTP_NOT_FOUND, "no such task", "invalid_request_error",
                               "not_found");
        return doc ? reply_json(req, MHD_HTTP_OK, doc) : MHD_NO;
    }
    if (*id != '\0')
        return reply_error(req, MHD_HTTP_NOT_FOUND, "no such endpoint", "invalid_request_error",
                           "no_such_endpoint");
    if (limit == 0 || limit > TASKS_LIMIT_MAX)
        limit = TASKS_LIMIT_DEFAULT;
    doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "object", "list");
    data = cJSON_AddArrayToObject(doc, "data");
    ok = data != NULL;
    pthread_mutex_lock(&store_lock);
    for (size_t i = 0, listed = 0; ok && i < ring_count && listed < limit; i++) {
        const struct async_task *t = newest(i);
        cJSON *item;

        if ((provider && strcmp(provider, t->p->name) != 0) ||
            (ref && (t->client_ref == NULL || strcmp(ref, t->client_ref) != 0)))
            continue;
        item = task_to_json(t);
        ok = item != NULL && cJSON_AddItemToArray(data, item);
        listed++;
    }
    pthread_mutex_unlock(&store_lock);
    if (!ok) {
        cJSON_Delete(doc);
        return reply_error(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory", "mock_error",
                           "oom");
    }
    return reply_json(req, MHD_HTTP_OK, doc);
}

/*
 * Parses a status of /_webhooks/send, a canonical word or one of the provider's labels,
 * into *v.  Returns false when t's provider has no such status.
 */
static bool parse_status_word(const struct async_task *t, const char *word, struct async_view *v)
{
    const struct async_kind *k = t->kind;

    if (strcmp(word, "succeeded") == 0 || strcmp(word, k->succeeded) == 0)
        *v = (struct async_view){AS_SUCCEEDED, 0};
    else if (strcmp(word, "failed") == 0 || strcmp(word, k->failed) == 0)
        *v = (struct async_view){AS_FAILED, 0};
    else if (strcmp(word, "canceled") == 0 || strcmp(word, k->canceled) == 0)
        *v = (struct async_view){AS_CANCELED, 0};
    else if (strcmp(word, "queued") == 0)
        *v = (struct async_view){AS_PENDING, 0};
    else if (strcmp(word, "running") == 0)
        *v = (struct async_view){AS_PENDING, (unsigned int)k->n_steps - 1};
    else {
        for (size_t i = 0; i < k->n_steps; i++) {
            if (strcmp(word, k->steps[i].label) == 0) {
                *v = (struct async_view){AS_PENDING, (unsigned int)i};
                return true;
            }
        }
        return false;
    }
    return true;
}

/* What POST /_webhooks/send asked for. */
struct send_request {
    char task_id[ASYNC_ID_MAX];
    char status[WH_LABEL_MAX]; /* empty: the task's current status */
    char url[MOCK_URL_MAX];    /* empty: the task's webhook URL */
    unsigned int copies;
    bool bad_signature;
    bool stale_timestamp;
};

/* Parses the body of POST /_webhooks/send into *s; returns an error text or NULL. */
static const char *parse_send(const cJSON *doc, struct send_request *s)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(doc, "task_id");
    const cJSON *status = cJSON_GetObjectItemCaseSensitive(doc, "status");
    const cJSON *url = cJSON_GetObjectItemCaseSensitive(doc, "url");
    const cJSON *dups = cJSON_GetObjectItemCaseSensitive(doc, "duplicates");
    const cJSON *item;

    memset(s, 0, sizeof(*s));
    s->copies = 1;
    if (!cJSON_IsObject(doc))
        return "the body must be a JSON object";
    cJSON_ArrayForEach(item, doc)
    {
        static const char *const known[] = {"task_id",    "status",        "url",
                                            "duplicates", "bad_signature", "stale_timestamp"};
        bool found = false;

        for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
            found |= strcmp(item->string, known[i]) == 0;
        if (!found)
            return "unknown key: task_id, status, url, duplicates, bad_signature and "
                   "stale_timestamp are known";
    }
    if (!cJSON_IsString(id) || strlen(id->valuestring) >= sizeof(s->task_id))
        return "task_id must be a task id";
    strcpy(s->task_id, id->valuestring);
    if (status && (!cJSON_IsString(status) || strlen(status->valuestring) >= sizeof(s->status)))
        return "status must be a status word";
    if (status)
        strcpy(s->status, status->valuestring);
    if (url && (!cJSON_IsString(url) || strlen(url->valuestring) >= sizeof(s->url) ||
                (strncmp(url->valuestring, "http://", 7) != 0 &&
                 strncmp(url->valuestring, "https://", 8) != 0)))
        return "url must be an http(s) URL";
    if (url)
        strcpy(s->url, url->valuestring);
    if (dups && (!cJSON_IsNumber(dups) || dups->valuedouble < 0 ||
                 dups->valuedouble > SEND_MAX_COPIES - 1 ||
                 dups->valuedouble != (double)(unsigned int)dups->valuedouble))
        return "duplicates must be an integer 0..10000";
    if (dups)
        s->copies = 1 + (unsigned int)dups->valuedouble;
    s->bad_signature = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "bad_signature"));
    s->stale_timestamp = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "stale_timestamp"));
    return NULL;
}

/*
 * POST /_webhooks/send {"task_id", "status", "duplicates", "bad_signature",
 * "stale_timestamp", "url"}: delivers the task's event for that status now, synchronously,
 * 1 + duplicates times, and answers the receiver's statuses.  A status ahead of the task
 * moves the task there first (without its automatic webhooks), so a re-fetch agrees with
 * the event; a status behind it is sent as a stale event and changes nothing.
 */
enum MHD_Result async_handle_send(struct mock_request *req)
{
    cJSON *doc = cJSON_ParseWithLength(req->body, req->body_len);
    struct send_request s;
    const char *problem = parse_send(doc, &s);
    struct async_task *t = NULL;
    struct wh_event *ev = NULL;
    struct event_sink discard;
    struct async_view v;
    int *statuses = NULL;
    size_t n;
    cJSON *out, *list;
    char event_id[WH_EVENT_ID_MAX] = "", label[WH_LABEL_MAX] = "", url[MOCK_URL_MAX] = "";

    cJSON_Delete(doc);
    if (problem)
        return reply_error(req, MHD_HTTP_BAD_REQUEST, problem, "mock_error", "invalid_send");
    sink_init(&discard);
    pthread_mutex_lock(&store_lock);
    t = find_any(s.task_id);
    if (t == NULL) {
        problem = "no such task";
    } else if (!t->kind->webhooks) {
        problem = "this provider sends no webhooks";
    } else if (s.url[0] == '\0' && t->webhook_url == NULL) {
        problem = "the task has no webhook URL; give \"url\"";
    } else if (s.status[0] && !parse_status_word(t, s.status, &v)) {
        problem = "status is not one of this provider's";
    } else {
        if (s.status[0] == '\0')
            v = async_current(t);
        else if (t->state == AS_PENDING && (v.state != AS_PENDING || v.step > t->step))
            move_to(t, v, &discard);
        ev = make_event(t, v, s.url[0] ? s.url : t->webhook_url);
        if (ev) {
            ev->copies = s.copies;
            ev->bad_signature = s.bad_signature;
            ev->stale_timestamp = s.stale_timestamp;
            memcpy(event_id, ev->event_id, sizeof(event_id));
            memcpy(label, ev->label, sizeof(label));
            snprintf(url, sizeof(url), "%s", ev->url);
        }
    }
    pthread_mutex_unlock(&store_lock);
    wh_event_free_all(discard.head);
    if (problem)
        return reply_error(req, t ? MHD_HTTP_BAD_REQUEST : MHD_HTTP_NOT_FOUND, problem,
                           "mock_error", t ? "invalid_send" : "not_found");
    statuses = ev ? calloc(s.copies, sizeof(*statuses)) : NULL;
    if (statuses == NULL) {
        wh_event_free_all(ev);
        return reply_error(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory", "mock_error",
                           "oom");
    }
    n = webhooks_deliver_now(ev, statuses, s.copies);
    out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "task_id", s.task_id);
    cJSON_AddStringToObject(out, "event_id", event_id);
    cJSON_AddStringToObject(out, "event", label);
    cJSON_AddStringToObject(out, "url", url);
    cJSON_AddNumberToObject(out, "deliveries", (double)n);
    list = cJSON_AddArrayToObject(out, "statuses");
    for (size_t i = 0; list && i < n && i < s.copies; i++)
        cJSON_AddItemToArray(list, cJSON_CreateNumber(statuses[i]));
    free(statuses);
    return reply_json(req, MHD_HTTP_OK, out);
}
