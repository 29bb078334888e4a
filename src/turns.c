#include "idemgate/turns.h"

#include "idemgate/clock.h"
#include "idemgate/wake.h"

#include <libpq-fe.h>
#include <stdlib.h>
#include <string.h>

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

int turn_ring_set(struct turn_ring *r, const long long *ids, size_t n)
{
    if (n > r->cap) {
        long long *v = realloc(r->ids, n * sizeof(*v));
        if (!v) {
            r->n = 0;
            return -1;
        }
        r->ids = v;
        r->cap = n;
    }
    if (n)
        memcpy(r->ids, ids, n * sizeof(*ids));
    qsort(r->ids, n, sizeof(*r->ids), cmp_ll);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (k == 0 || r->ids[k - 1] != r->ids[i])
            r->ids[k++] = r->ids[i];
    r->n = k;
    return 0;
}

int turn_ring_wraps(const struct turn_ring *r)
{
    return r->n == 0 || r->ids[r->n - 1] <= r->last;
}

int turn_ring_next(struct turn_ring *r, long long *tenant)
{
    if (!r->n)
        return 0;
    size_t i = 0;
    while (i < r->n && r->ids[i] <= r->last)
        i++;
    *tenant = r->last = r->ids[i < r->n ? i : 0];
    return 1;
}

void turn_ring_drop(struct turn_ring *r, long long tenant)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->ids[i] == tenant) {
            memmove(&r->ids[i], &r->ids[i + 1], (r->n - i - 1) * sizeof(*r->ids));
            r->n--;
            return;
        }
}

void turn_ring_keep(struct turn_ring *r, long long tenant, long long before)
{
    if (r->last == tenant)
        r->last = before;
}

void turn_ring_fini(struct turn_ring *r)
{
    free(r->ids);
    memset(r, 0, sizeof(*r));
}

/* Reads the ring again when a round is over (the next turn would wrap, or the ring is empty),
 * when news of work came since the last read, and when the read is stale. */
static int refresh(struct turns *t, struct db *db, turns_read_fn read, void *arg)
{
    unsigned long news = wake_news();
    double now = clock_mono();
    pthread_mutex_lock(&t->mu);
    int due = turn_ring_wraps(&t->ring) || t->news != news || t->read_at == 0 ||
              (now - t->read_at) * 1000 >= TURNS_REFRESH_MS;
    pthread_mutex_unlock(&t->mu);
    if (!due)
        return STORE_OK;
    long long *ids = NULL;
    size_t n = 0;
    int e = read(db, arg, &ids, &n);
    if (e != STORE_OK)
        return e;
    pthread_mutex_lock(&t->mu);
    e = turn_ring_set(&t->ring, ids, n) < 0 ? STORE_EINTERNAL : STORE_OK;
    t->news = news;
    t->read_at = now;
    pthread_mutex_unlock(&t->mu);
    free(ids);
    return e;
}

int turns_claim(struct turns *t, struct db *db, turns_read_fn read, turns_claim_fn claim, void *arg)
{
    int e = refresh(t, db, read, arg);
    if (e != STORE_OK)
        return e;
    /* At most one try per tenant in the ring (others' threads may drop or add meanwhile). */
    pthread_mutex_lock(&t->mu);
    size_t tries = t->ring.n;
    pthread_mutex_unlock(&t->mu);
    for (size_t i = 0; i < tries; i++) {
        long long tenant;
        pthread_mutex_lock(&t->mu);
        long long before = t->ring.last;
        int some = turn_ring_next(&t->ring, &tenant);
        pthread_mutex_unlock(&t->mu);
        if (!some)
            break;
        e = claim(db, tenant, arg);
        if (e == TURN_KEPT) {
            pthread_mutex_lock(&t->mu);
            turn_ring_keep(&t->ring, tenant, before);
            pthread_mutex_unlock(&t->mu);
            return STORE_ERETRY;
        }
        if (e != STORE_ENOTFOUND)
            return e;
        pthread_mutex_lock(&t->mu);
        turn_ring_drop(&t->ring, tenant);
        pthread_mutex_unlock(&t->mu);
    }
    return STORE_ENOTFOUND;
}

int turns_read(struct db *db, const struct db_stmt *s, const char *providers, long long **ids,
               size_t *n)
{
    PGresult *r;
    *ids = NULL;
    *n = 0;
    int e = providers ? db_run(db, s, DB_ARGS(p_text("providers", providers)), &r)
                      : db_run(db, s, NULL, 0, &r);
    if (e < 0)
        return e;
    int rows = PQntuples(r);
    if (rows && !(*ids = malloc((size_t)rows * sizeof(**ids)))) {
        PQclear(r);
        return STORE_EINTERNAL;
    }
    for (int i = 0; i < rows; i++)
        (*ids)[i] = atoll(PQgetvalue(r, i, 0));
    *n = (size_t)rows;
    PQclear(r);
    return STORE_OK;
}
