#include "idemgate/tenants.h"

#include "idemgate/clock.h"
#include "idemgate/log.h"
#include "idemgate/store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One token: a live tenant's (id > 0) or no tenant's (id 0), as the database said at seen_at
 * (clock_mono, taken before the read began). Open addressing by the token hash; the table is
 * rebuilt whole by every refresh, which drops what the read did not return. */
struct entry {
    char token[65];
    long long id;
    char name[72];
    double seen_at;
};

static struct {
    pthread_mutex_t mu;
    struct entry *v;
    size_t cap, n, refused;
    double refreshed_at; /* clock_mono when the last refresh began (under mu) */
    atomic_int refreshing;
} T = {.mu = PTHREAD_MUTEX_INITIALIZER};

static size_t slot_of(const char *token, size_t cap)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)token; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h & (cap - 1);
}

/* The slot of token in v (its entry, or the empty slot where it belongs); v has an empty slot. */
static struct entry *slot(struct entry *v, size_t cap, const char *token)
{
    size_t i = slot_of(token, cap);
    while (v[i].token[0] && strcmp(v[i].token, token) != 0)
        i = (i + 1) & (cap - 1);
    return &v[i];
}

/* Puts e into the table *v of *cap slots holding *n, growing it to stay at most half full; -1
 * when out of memory (the table is unchanged). */
static int put(struct entry **v, size_t *cap, size_t *n, const struct entry *e)
{
    if ((*n + 1) * 2 > *cap) {
        size_t ncap = *cap ? *cap * 2 : 64;
        struct entry *nv = calloc(ncap, sizeof(*nv));
        if (!nv)
            return -1;
        for (size_t i = 0; i < *cap; i++)
            if ((*v)[i].token[0])
                *slot(nv, ncap, (*v)[i].token) = (*v)[i];
        free(*v);
        *v = nv;
        *cap = ncap;
    }
    struct entry *s = slot(*v, *cap, e->token);
    *n += !s->token[0];
    *s = *e;
    return 0;
}

static int well_formed(const char *token_hash)
{
    return strlen(token_hash) == 64 && strspn(token_hash, "0123456789abcdef") == 64;
}

int tenants_lookup(const char *token_hash, struct tenant *out)
{
    if (!well_formed(token_hash))
        return -1;
    int found = 0;
    pthread_mutex_lock(&T.mu);
    if (T.cap) {
        const struct entry *e = slot(T.v, T.cap, token_hash);
        if (e->token[0] && clock_mono() - e->seen_at < TENANTS_MAX_AGE_S) {
            found = e->id > 0 ? 1 : -1;
            if (found > 0) {
                out->id = e->id;
                snprintf(out->name, sizeof(out->name), "%s", e->name);
            }
        }
    }
    pthread_mutex_unlock(&T.mu);
    return found;
}

long long tenants_known(const char *token_hash)
{
    if (!well_formed(token_hash))
        return 0;
    long long id = 0;
    pthread_mutex_lock(&T.mu);
    if (T.cap) {
        const struct entry *e = slot(T.v, T.cap, token_hash);
        if (e->token[0] && e->id > 0)
            id = e->id;
    }
    pthread_mutex_unlock(&T.mu);
    return id;
}

int tenants_get(struct db *db, const char *token_hash, struct tenant *out)
{
    int known = tenants_lookup(token_hash, out);
    if (known)
        return known > 0 ? STORE_OK : STORE_EAUTH;
    struct entry e = {.seen_at = clock_mono()};
    snprintf(e.token, sizeof(e.token), "%s", token_hash);
    int rc = store_tenant_of_token(db, token_hash, &e.id, e.name, sizeof(e.name));
    if (rc != STORE_OK && rc != STORE_EAUTH)
        return rc;
    pthread_mutex_lock(&T.mu);
    /* A refused token is remembered only up to a bound, and only until the next refresh. */
    if (e.id > 0 || T.refused < TENANTS_MAX_REFUSED) {
        size_t before = T.n;
        if (put(&T.v, &T.cap, &T.n, &e) == 0 && e.id == 0)
            T.refused += T.n > before;
    }
    pthread_mutex_unlock(&T.mu);
    if (rc == STORE_OK) {
        out->id = e.id;
        snprintf(out->name, sizeof(out->name), "%s", e.name);
    }
    return rc;
}

int tenants_refresh_due(void)
{
    pthread_mutex_lock(&T.mu);
    int due = T.refreshed_at <= 0 || clock_mono() - T.refreshed_at >= TENANTS_REFRESH_S;
    pthread_mutex_unlock(&T.mu);
    int expected = 0;
    return due && atomic_compare_exchange_strong(&T.refreshing, &expected, 1);
}

struct rows {
    struct entry *v;
    size_t cap, n;
    double at;
    int oom;
};

static void add_row(long long id, const char *name, const char *token, void *arg)
{
    struct rows *r = arg;
    struct entry e = {.id = id, .seen_at = r->at};
    if (r->oom || !well_formed(token) || id <= 0)
        return;
    snprintf(e.token, sizeof(e.token), "%s", token);
    snprintf(e.name, sizeof(e.name), "%s", name);
    r->oom = put(&r->v, &r->cap, &r->n, &e) < 0;
}

void tenants_refresh(struct db *db)
{
    struct rows r = {.at = clock_mono()};
    int e = db ? store_tenants_all(db, add_row, &r) : STORE_EUNAVAIL;
    pthread_mutex_lock(&T.mu);
    T.refreshed_at = r.at; /* a failure is tried again after the same interval */
    if (e == STORE_OK && !r.oom) {
        free(T.v);
        T.v = r.v;
        T.cap = r.cap;
        T.n = r.n;
        T.refused = 0;
        r.v = NULL;
    }
    pthread_mutex_unlock(&T.mu);
    if (e != STORE_OK && db)
        LOG(LOG_WARN, "tenants_unread", LI("error", e));
    free(r.v);
    atomic_store(&T.refreshing, 0);
}

void tenants_fini(void)
{
    pthread_mutex_lock(&T.mu);
    free(T.v);
    T.v = NULL;
    T.cap = T.n = T.refused = 0;
    T.refreshed_at = 0;
    pthread_mutex_unlock(&T.mu);
}
