/*
 * idemgate-mock: the append-only ledger of received creates (see ledger.h).
 */
#include "ledger.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

/* One stored entry: the caller's record with owned copies of its strings. */
struct ledger_entry {
    unsigned long seq;
    double time;
    struct ledger_record rec;
};

static pthread_mutex_t ledger_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ledger_entry *entries;
static size_t entry_count;
static size_t entry_cap;

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
    free((char *)e->rec.idempotency_key);
    free((char *)e->rec.client_ref);
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
 * and the current wall-clock time.  Stores the sequence number in *seq.  Returns false
 * when the ledger is full or memory ran out; nothing is recorded then.
 */
bool ledger_append(const struct ledger_record *rec, unsigned long *seq)
{
    struct ledger_entry e;
    bool ok = true;

    e.rec = *rec;
    e.rec.idempotency_key = dup_or_null(rec->idempotency_key, &ok);
    e.rec.client_ref = dup_or_null(rec->client_ref, &ok);
    if (!ok) {
        free_entry(&e);
        return false;
    }

    pthread_mutex_lock(&ledger_lock);
    if (entry_count >= LEDGER_MAX_ENTRIES || !reserve_one()) {
        pthread_mutex_unlock(&ledger_lock);
        free_entry(&e);
        return false;
    }
    /* The time is taken under the lock so that it never decreases along the sequence. */
    e.seq = entry_count + 1;
    e.time = now_unix();
    entries[entry_count++] = e;
    pthread_mutex_unlock(&ledger_lock);

    *seq = e.seq;
    return true;
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
    add_string_or_null(obj, "idempotency_key", e->rec.idempotency_key);
    add_string_or_null(obj, "client_ref", e->rec.client_ref);
    cJSON_AddStringToObject(obj, "body_sha256", e->rec.body_sha256);
    cJSON_AddNumberToObject(obj, "remote_port", e->rec.remote_port);
    add_string_or_null(obj, "fault", e->rec.fault);
    if (e->rec.status == LEDGER_NO_STATUS)
        cJSON_AddNullToObject(obj, "status");
    else
        cJSON_AddNumberToObject(obj, "status", e->rec.status);
    cJSON_AddBoolToObject(obj, "replay", e->rec.replay);
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

    pthread_mutex_lock(&ledger_lock);
    count = entry_count;
    for (size_t i = 0; ok && i < count; i++) {
        cJSON *item = entry_to_json(&entries[i]);

        ok = item != NULL && cJSON_AddItemToArray(list, item);
    }
    pthread_mutex_unlock(&ledger_lock);

    cJSON_AddNumberToObject(doc, "count", (double)count);
    text = ok ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    return text;
}

/* Forgets every entry and restarts the sequence at 1. */
void ledger_reset(void)
{
    pthread_mutex_lock(&ledger_lock);
    for (size_t i = 0; i < entry_count; i++)
        free_entry(&entries[i]);
    entry_count = 0;
    pthread_mutex_unlock(&ledger_lock);
}

/* Frees all ledger memory at exit; no other ledger call may run concurrently. */
void ledger_shutdown(void)
{
    ledger_reset();
    free(entries);
    entries = NULL;
    entry_cap = 0;
}
