#include "idemgate/limits.h"

#include "idemgate/clock.h"
#include "idemgate/log.h"
#include "idemgate/store.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double lim_take(struct lim_bucket *b, double now, double rate, double burst)
{
    if (rate <= 0)
        return 0;
    if (burst < 1)
        burst = 1;
    if (b->at <= 0 || now < b->at) { /* a new bucket starts full; a clock step back refills none */
        if (b->at <= 0)
            b->tokens = burst;
        b->at = now;
    }
    b->tokens = fmin(burst, b->tokens + (now - b->at) * rate);
    b->at = now;
    if (b->tokens >= 1) {
        b->tokens -= 1;
        return 0;
    }
    return (1 - b->tokens) / rate;
}

int lim_value(int tenant_value, int default_value)
{
    return tenant_value >= 0 ? tenant_value : default_value;
}

int lim_retry_after(double s)
{
    double up = ceil(s);
    return up < 1 ? 1 : up > 3600 ? 3600 : (int)up;
}

/* One tenant: its limits as last read, and this replica's counts. Open addressing by the token
 * hash; entries of tenants that disappear stay (marked gone) until the table is rebuilt. */
struct tenant_lim {
    char token[65];
    int rps, burst, waits; /* -1: default */
    int live;
    struct lim_bucket bucket;
    int waits_held;
};

static struct {
    pthread_mutex_t mu;
    struct tenant_lim *v;
    size_t cap, n;
    int def_rps, def_burst, def_waits;
    atomic_int refreshing;
    double refreshed_at; /* clock_mono of the last refresh (under mu) */
    int ready;
} L = {.mu = PTHREAD_MUTEX_INITIALIZER};

static size_t slot_of(const char *token, size_t cap)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)token; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h & (cap - 1);
}

/* The entry for token, or NULL; the caller holds the lock. */
static struct tenant_lim *find(const char *token)
{
    if (!L.cap)
        return NULL;
    for (size_t i = slot_of(token, L.cap), k = 0; k < L.cap; i = (i + 1) & (L.cap - 1), k++) {
        if (!L.v[i].token[0])
            return NULL;
        if (strcmp(L.v[i].token, token) == 0)
            return &L.v[i];
    }
    return NULL;
}

/* Inserts (or finds) token; the caller holds the lock and made room. */
static struct tenant_lim *insert(struct tenant_lim *v, size_t cap, const char *token)
{
    for (size_t i = slot_of(token, cap);; i = (i + 1) & (cap - 1)) {
        if (!v[i].token[0]) {
            snprintf(v[i].token, sizeof(v[i].token), "%s", token);
            v[i].rps = v[i].burst = v[i].waits = -1;
            return &v[i];
        }
        if (strcmp(v[i].token, token) == 0)
            return &v[i];
    }
}

int limits_init(const struct cfg *cfg)
{
    pthread_mutex_lock(&L.mu);
    L.def_rps = cfg->tenant_requests_per_second;
    L.def_burst = cfg->tenant_burst;
    L.def_waits = cfg->tenant_wait_connections;
    L.ready = 1;
    pthread_mutex_unlock(&L.mu);
    return 0;
}

void limits_fini(void)
{
    pthread_mutex_lock(&L.mu);
    free(L.v);
    L.v = NULL;
    L.cap = L.n = 0;
    L.ready = 0;
    pthread_mutex_unlock(&L.mu);
}

int limits_refresh_due(void)
{
    pthread_mutex_lock(&L.mu);
    int due = L.ready && (L.refreshed_at <= 0 || clock_mono() - L.refreshed_at >= LIMITS_REFRESH_S);
    pthread_mutex_unlock(&L.mu);
    int expected = 0;
    return due && atomic_compare_exchange_strong(&L.refreshing, &expected, 1);
}

struct rows {
    struct tenant_lim *v;
    size_t cap, n;
    int oom;
};

static void add_row(const char *token, int rps, int burst, int waits, void *arg)
{
    struct rows *r = arg;
    if (r->oom || strlen(token) != 64)
        return;
    if ((r->n + 1) * 2 > r->cap) { /* at most half full */
        size_t cap = r->cap ? r->cap * 2 : 64;
        struct tenant_lim *nv = calloc(cap, sizeof(*nv));
        if (!nv) {
            r->oom = 1;
            return;
        }
        for (size_t i = 0; i < r->cap; i++)
            if (r->v[i].token[0])
                *insert(nv, cap, r->v[i].token) = r->v[i];
        free(r->v);
        r->v = nv;
        r->cap = cap;
    }
    struct tenant_lim *e = insert(r->v, r->cap, token);
    e->rps = rps;
    e->burst = burst;
    e->waits = waits;
    e->live = 1;
    r->n++;
}

void limits_refresh(struct db *db)
{
    struct rows r = {0};
    int e = db ? store_tenant_limits_all(db, add_row, &r) : STORE_EUNAVAIL;
    pthread_mutex_lock(&L.mu);
    L.refreshed_at = clock_mono(); /* a failure is tried again after the same interval */
    if (e == STORE_OK && !r.oom && L.ready) {
        /* This replica's counts carry over; a tenant that went away is dropped, and its waits
         * still held end without being counted. */
        for (size_t i = 0; i < r.cap; i++) {
            struct tenant_lim *old = r.v[i].token[0] ? find(r.v[i].token) : NULL;
            if (old) {
                r.v[i].bucket = old->bucket;
                r.v[i].waits_held = old->waits_held;
            }
        }
        free(L.v);
        L.v = r.v;
        L.cap = r.cap;
        L.n = r.n;
        r.v = NULL;
    }
    pthread_mutex_unlock(&L.mu);
    if (e != STORE_OK)
        LOG(LOG_WARN, "tenant_limits_unread", LI("error", e));
    free(r.v);
    atomic_store(&L.refreshing, 0);
}

int limits_admit(const char *token_hash)
{
    pthread_mutex_lock(&L.mu);
    struct tenant_lim *t = find(token_hash);
    double wait = 0;
    if (t) {
        int rps = lim_value(t->rps, L.def_rps);
        int burst = lim_value(t->burst, L.def_burst);
        wait = lim_take(&t->bucket, clock_mono(), rps, burst > 0 ? burst : rps);
    }
    pthread_mutex_unlock(&L.mu);
    return wait > 0 ? lim_retry_after(wait) : 0;
}

int limits_wait_begin(const char *token_hash, int *counted)
{
    pthread_mutex_lock(&L.mu);
    struct tenant_lim *t = find(token_hash);
    int refused = 0;
    *counted = 0;
    if (t) {
        int max = lim_value(t->waits, L.def_waits);
        if (max > 0 && t->waits_held >= max)
            refused = 1;
        else
            t->waits_held++, *counted = 1;
    }
    pthread_mutex_unlock(&L.mu);
    return refused; /* a held wait ends at its deadline at the latest: one second is the hint */
}

void limits_wait_end(const char *token_hash)
{
    pthread_mutex_lock(&L.mu);
    struct tenant_lim *t = find(token_hash);
    if (t && t->waits_held > 0)
        t->waits_held--;
    pthread_mutex_unlock(&L.mu);
}
