/*
 * idemgate-mock: the append-only ledger of received creates, and the tasks they made
 * (see ledger.h).
 */
#include "ledger.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

/*
 * One stored entry: the caller's record with owned copies of its strings.  A seeded task
 * (POST /_tasks/seed) is an entry too, so that it takes its place in the lists among the
 * tasks creates made, but it has no sequence number and GET /_ledger leaves it out.
 */
struct ledger_entry {
    unsigned long seq; /* 0 for a seeded task */
    double time;
    double visible_at; /* lookups and lists show the task from this Unix time on */
    struct ledger_record rec;
    char *result;  /* the task's result once ledger_attach_task() ran, else NULL: no task */
    char *task_id; /* the provider's task id, or NULL for "task_<seq>" */
};

/*
 * Reads (lookups, list pages, /_ledger) share the lock; a create's append waits only for the
 * reads under way, never behind a queue of later ones (writers first).  A list page copies up
 * to a thousand task bodies: behind one mutex, with the gateway searching many operations at
 * once, creates waited there for up to a minute (1,570 threads found blocked on it) and were
 * recorded long after the client had given up.
 */
static pthread_rwlock_t ledger_lock = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
static struct ledger_entry *entries;
static size_t entry_count; /* every entry, seeded tasks included */
static size_t entry_cap;
static unsigned long create_count; /* the entries of creates: the last sequence number */
/* Counts resets, so a task attached late never lands on an entry of the next epoch. */
static unsigned long epoch;

/* Writes the id of the task that the entry numbered seq made into id (LEDGER_TASK_ID_MAX). */
void ledger_task_id(unsigned long seq, char *id)
{
    snprintf(id, LEDGER_TASK_ID_MAX, "task_%lu", seq);
}

/* Returns a heap copy of s, NULL for NULL; *ok turns false when memory ran out. */
static char *dup_or_null(const char *s, bool *ok)
{
    char *copy;

    if (s == NULL)
        return NULL;
    copy = strdup(s);
    if (copy == NULL)
        *ok = false;
    return copy;
}

/* Returns the current wall-clock time as Unix seconds with a fractional part. */
static double now_unix(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Frees the strings one entry owns.  The caller holds ledger_lock or is the only thread. */
static void free_entry(struct ledger_entry *e)
{
    free((char *)e->rec.route);
    free((char *)e->rec.idempotency_key);
    free((char *)e->rec.client_ref);
    free((char *)e->rec.content_type);
    free(e->result);
    free(e->task_id);
}

/*
 * Grows the entry array so that one more entry fits.  The caller holds ledger_lock.
 * Returns false when memory ran out.
 */
static bool reserve_one(void)
{
    size_t cap;
    struct ledger_entry *grown;

    if (entry_count < entry_cap)
        return true;
    cap = entry_cap ? entry_cap * 2 : 256;
    if (cap > LEDGER_MAX_ENTRIES)
        cap = LEDGER_MAX_ENTRIES;
    grown = realloc(entries, cap * sizeof(*entries));
    if (grown == NULL)
        return false;
    entries = grown;
    entry_cap = cap;
    return true;
}

/*
 * Appends a copy of rec with the next sequence number (1-based, restarting after a reset)
 * and the current wall-clock time.  Stores the entry's name in *slot.  Returns false when
 * the ledger is full or memory ran out; nothing is recorded then.
 */
bool ledger_append(const struct ledger_record *rec, struct ledger_slot *slot)
{
    struct ledger_entry e;
    bool ok = true;

    e.rec = *rec;
    e.result = NULL;
    e.task_id = NULL;
    e.visible_at = 0;
    e.rec.route = dup_or_null(rec->route, &ok);
    e.rec.idempotency_key = dup_or_null(rec->idempotency_key, &ok);
    e.rec.client_ref = dup_or_null(rec->client_ref, &ok);
    e.rec.content_type = dup_or_null(rec->content_type, &ok);
    if (!ok) {
        free_entry(&e);
        return false;
    }

    pthread_rwlock_wrlock(&ledger_lock);
    if (entry_count >= LEDGER_MAX_ENTRIES || !reserve_one()) {
        pthread_rwlock_unlock(&ledger_lock);
        free_entry(&e);
        return false;
    }
    /* The time is taken under the lock so that it never decreases along the sequence. */
    e.seq = ++create_count;
    e.time = now_unix();
    entries[entry_count++] = e;
    slot->seq = e.seq;
    slot->pos = entry_count;
    slot->epoch = epoch;
    pthread_rwlock_unlock(&ledger_lock);
    return true;
}

/*
 * Marks the entry named by slot as having made a task whose result is the JSON text
 * result (copied).  task_id is the provider's id of the task (copied), or NULL for the
 * ledger's own "task_<seq>".  Returns false when memory ran out or a reset forgot the entry.
 */
bool ledger_attach_task(const struct ledger_slot *slot, const char *task_id, const char *result,
                        unsigned int visible_after_ms)
{
    bool ok = true, attached = false;
    char *copy = dup_or_null(result, &ok);
    char *id = task_id ? strndup(task_id, LEDGER_ASYNC_ID_MAX) : NULL;

    if (copy == NULL || (task_id && id == NULL)) {
        free(copy);
        free(id);
        return false;
    }
    pthread_rwlock_wrlock(&ledger_lock);
    if (slot->epoch == epoch && slot->pos >= 1 && slot->pos <= entry_count &&
        entries[slot->pos - 1].result == NULL) {
        struct ledger_entry *e = &entries[slot->pos - 1];

        e->result = copy;
        e->task_id = id;
        e->visible_at = e->time + visible_after_ms / 1000.0;
        attached = true;
    }
    pthread_rwlock_unlock(&ledger_lock);
    if (!attached) {
        free(copy);
        free(id);
    }
    return attached;
}

/*
 * Adds a task that no create made (POST /_tasks/seed): it has a position, so lookups and
 * lists show it, but no sequence number, and GET /_ledger leaves it out.  The strings are
 * copied.  Returns false when the ledger is full or memory ran out.
 */
bool ledger_seed_task(const char *provider, const char *task_id, const char *client_ref,
                      const char *result)
{
    struct ledger_entry e = {0};
    bool ok = true;

    e.rec.provider = provider;
    e.rec.status = LEDGER_NO_STATUS;
    e.rec.client_ref = dup_or_null(client_ref, &ok);
    e.task_id = dup_or_null(task_id, &ok);
    e.result = dup_or_null(result, &ok);
    if (!ok) {
        free_entry(&e);
        return false;
    }
    pthread_rwlock_wrlock(&ledger_lock);
    if (entry_count >= LEDGER_MAX_ENTRIES || !reserve_one()) {
        pthread_rwlock_unlock(&ledger_lock);
        free_entry(&e);
        return false;
    }
    e.time = now_unix();
    e.visible_at = e.time;
    entries[entry_count++] = e;
    pthread_rwlock_unlock(&ledger_lock);
    return true;
}

/* Returns how many resets there have been, so a list cursor can tell it is stale. */
unsigned long ledger_epoch(void)
{
    unsigned long n;

    pthread_rwlock_rdlock(&ledger_lock);
    n = epoch;
    pthread_rwlock_unlock(&ledger_lock);
    return n;
}

/* Writes the id of the task of entry e into buf (LEDGER_TASK_ID_MAX) and returns it. */
static const char *entry_task_id(const struct ledger_entry *e, char *buf)
{
    if (e->task_id)
        return e->task_id;
    ledger_task_id(e->seq, buf);
    return buf;
}

/*
 * Returns true when the task of entry e is one that q selects at Unix time now.  The
 * caller holds the lock.
 */
static bool task_matches(const struct ledger_entry *e, const struct ledger_task_query *q,
                         double now)
{
    /* The bounds are whole seconds, so a task counts for the second it was created in. */
    long long second = (long long)floor(e->time);

    if (e->result == NULL || strcmp(e->rec.provider, q->provider) != 0 || e->visible_at > now)
        return false;
    if (q->client_ref &&
        (e->rec.client_ref == NULL || strcmp(e->rec.client_ref, q->client_ref) != 0))
        return false;
    if (q->id) {
        char buf[LEDGER_TASK_ID_MAX];

        if (strcmp(entry_task_id(e, buf), q->id) != 0)
            return false;
    }
    if (q->has_since && second < q->since)
        return false;
    if (q->has_until && second > q->until)
        return false;
    return true;
}

/*
 * Calls visit for each task that q selects, newest first, with the ledger locked: visit
 * must not call back into the ledger.  Stops after q->limit tasks or when visit returns
 * false.  Returns false when a visit did.
 */
bool ledger_each_task(const struct ledger_task_query *q,
                      bool (*visit)(const struct ledger_task *t, void *ctx), void *ctx, bool *more)
{
    double now = now_unix();
    size_t visited = 0, start;
    bool ok = true;

    if (more)
        *more = false;
    pthread_rwlock_rdlock(&ledger_lock);
    start = q->before && q->before - 1 < entry_count ? q->before - 1 : entry_count;
    for (size_t i = start; ok && i > 0; i--) {
        const struct ledger_entry *e = &entries[i - 1];
        char id[LEDGER_TASK_ID_MAX];
        struct ledger_task t;

        if (!task_matches(e, q, now))
            continue;
        if (visited == q->limit) {
            if (more)
                *more = true;
            break;
        }
        t.pos = i;
        t.id = entry_task_id(e, id);
        t.created = e->time;
        t.client_ref = e->rec.client_ref;
        t.result = e->result;
        ok = visit(&t, ctx);
        visited++;
    }
    pthread_rwlock_unlock(&ledger_lock);
    return ok;
}

/* Adds s to obj under name, or a JSON null when s is NULL. */
static void add_string_or_null(cJSON *obj, const char *name, const char *s)
{
    if (s)
        cJSON_AddStringToObject(obj, name, s);
    else
        cJSON_AddNullToObject(obj, name);
}

/* Builds the JSON object for one entry, or NULL when memory ran out. */
static cJSON *entry_to_json(const struct ledger_entry *e)
{
    cJSON *obj = cJSON_CreateObject();

    if (obj == NULL)
        return NULL;
    cJSON_AddNumberToObject(obj, "seq", (double)e->seq);
    cJSON_AddNumberToObject(obj, "time", e->time);
    cJSON_AddStringToObject(obj, "route", e->rec.route);
    cJSON_AddStringToObject(obj, "provider", e->rec.provider);
    add_string_or_null(obj, "idempotency_key", e->rec.idempotency_key);
    add_string_or_null(obj, "client_ref", e->rec.client_ref);
    add_string_or_null(obj, "client_ref_source", e->rec.client_ref_source);
    cJSON_AddStringToObject(obj, "body_sha256", e->rec.body_sha256);
    add_string_or_null(obj, "content_type", e->rec.content_type);
    cJSON_AddNumberToObject(obj, "remote_port", e->rec.remote_port);
    add_string_or_null(obj, "fault", e->rec.fault);
    if (e->rec.status == LEDGER_NO_STATUS)
        cJSON_AddNullToObject(obj, "status");
    else
        cJSON_AddNumberToObject(obj, "status", e->rec.status);
    cJSON_AddBoolToObject(obj, "replay", e->rec.replay);
    if (e->result) {
        char id[LEDGER_TASK_ID_MAX];

        cJSON_AddStringToObject(obj, "task_id", entry_task_id(e, id));
    } else {
        cJSON_AddNullToObject(obj, "task_id");
    }
    add_string_or_null(obj, "auth_sha256", e->rec.has_auth ? e->rec.auth_sha256 : NULL);
    add_string_or_null(obj, "behavior", e->rec.behavior);
    return obj;
}

/*
 * Renders the ledger as {"creates": [...], "count": N}.  Returns a heap string the caller
 * frees, or NULL when memory ran out.
 */
char *ledger_to_json(void)
{
    cJSON *doc = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(doc, "creates");
    size_t count;
    char *text;
    bool ok = list != NULL;

    pthread_rwlock_rdlock(&ledger_lock);
    count = create_count;
    for (size_t i = 0; ok && i < entry_count; i++) {
        cJSON *item;

        if (entries[i].seq == 0)
            continue;
        item = entry_to_json(&entries[i]);
        ok = item != NULL && cJSON_AddItemToArray(list, item);
    }
    pthread_rwlock_unlock(&ledger_lock);

    cJSON_AddNumberToObject(doc, "count", (double)count);
    text = ok ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    return text;
}

/* Forgets every entry and every task, and restarts the sequence at 1. */
void ledger_reset(void)
{
    pthread_rwlock_wrlock(&ledger_lock);
    for (size_t i = 0; i < entry_count; i++)
        free_entry(&entries[i]);
    entry_count = 0;
    create_count = 0;
    epoch++;
    pthread_rwlock_unlock(&ledger_lock);
}

/* Frees all ledger memory at exit; no other ledger call may run concurrently. */
void ledger_shutdown(void)
{
    ledger_reset();
    free(entries);
    entries = NULL;
    entry_cap = 0;
}
