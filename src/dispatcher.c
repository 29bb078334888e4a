#include "idemgate/dispatcher.h"

#include "idemgate/attempt.h"
#include "idemgate/clock.h"
#include "idemgate/crash.h"
#include "idemgate/engine.h"
#include "idemgate/lease.h"
#include "idemgate/log.h"
#include "idemgate/resultq.h"
#include "idemgate/wake.h"
#include "idemgate/wpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The pause after the database refused a claim (or is being migrated). */
#define ERROR_WAIT_MS 200
/* Results one thread writes before it looks at anything else (claims, handoffs). */
#define RESULTS_PER_TURN 64

/* One create in the engine: allocated before the call, so that its end is never lost to a
 * failed allocation; its result is written by whichever dispatcher thread takes it. */
struct flight {
    struct rq_item node;
    struct dispatcher *d;
    struct attempt *a;
    struct up_response res;
    double t1; /* wall clock when the call ended */
};

struct dispatcher {
    const struct cfg *cfg;
    struct wpool *pool;
    struct eng *eng;
    struct rq *results; /* calls that ended */
};

/* The engine slot of a provider: its index in the configuration, -1 when not configured here. */
static int slot_of(const struct cfg *cfg, const char *provider)
{
    const struct cfg_provider *p =
        provider ? cfg_find_provider(cfg, provider, strlen(provider)) : NULL;
    return p ? (int)(p - cfg->providers) : -1;
}

static void write_flight(struct rq_item *it, struct db *db)
{
    struct flight *f = (struct flight *)it;
    attempt_end(f->a, db, &f->res, f->t1);
    free(f);
}

/* Runs on an engine thread: the call ended; its result is queued for a dispatcher thread (which
 * holds a database connection) to write. */
static void on_call_end(void *arg, struct up_response *res)
{
    struct flight *f = arg;
    f->res = *res;
    f->t1 = clock_wall();
    f->node.write = write_flight;
    rq_push(f->d->results, &f->node);
}

/* Writes up to RESULTS_PER_TURN ended calls' results; 1 when it wrote any. */
static int write_results(struct db *db, void *arg)
{
    struct dispatcher *d = arg;
    return rq_run(d->results, db, RESULTS_PER_TURN);
}

/* The text[] literal of the providers whose calls are at their own limit here, into buf; "{}"
 * when none. Provider names are [a-z0-9_-]+: no quoting is needed. */
static void full_providers(const struct dispatcher *d, char *buf, size_t len)
{
    size_t pos = 0;
    buf[pos++] = '{';
    for (size_t i = 0; i < d->cfg->n_providers; i++) {
        const char *name = d->cfg->providers[i].name;
        size_t n = strlen(name);
        if (!eng_provider_full(d->eng, (int)i) || pos + n + 3 >= len)
            continue;
        if (pos > 1)
            buf[pos++] = ',';
        memcpy(buf + pos, name, n);
        pos += n;
    }
    buf[pos++] = '}';
    buf[pos] = '\0';
}

/* Claims one due create when the engine has room for its call; the slot is taken before the
 * claim and given back when nothing was claimed. */
static int claim_with_room(struct db *db, const char *owner, int lease_seconds,
                           struct store_claim *out, void *arg)
{
    struct dispatcher *d = arg;
    char skip[4096];
    if (!eng_acquire(d->eng, -1))
        return STORE_ENOTFOUND; /* full: a call's end wakes a thread to claim again */
    full_providers(d, skip, sizeof(skip));
    int e = store_claim(db, owner, lease_seconds, skip, out);
    if (e != STORE_OK) {
        eng_release(d->eng, -1);
        return e;
    }
    /* The slot is now the provider's too (a race between threads may pass the provider's own
     * limit by at most one call per dispatcher thread). */
    eng_assign(d->eng, slot_of(d->cfg, out->provider));
    return e;
}

/* Starts one create (its slot is taken): the row becomes `sending` if it is not yet, the call
 * goes to the engine, and this thread goes on. Its result is written by whichever dispatcher
 * thread takes it from the queue. */
static void dispatch_one(const struct cfg *cfg, struct db *db, struct store_claim *c,
                         double claimed_mono, void *arg)
{
    struct dispatcher *d = arg;
    int slot = slot_of(cfg, c->provider);
    struct attempt *a;
    struct up_xfer *x;
    struct up_response res;
    CRASH_POINT("after_sending_commit");
    if (attempt_begin(cfg, db, c, claimed_mono, &a) < 0) {
        eng_release(d->eng, slot);
        return;
    }
    struct flight *f = calloc(1, sizeof(*f));
    if (!f) {
        eng_release(d->eng, slot);
        attempt_abandon(a, db, "out of memory");
        return;
    }
    if (attempt_xfer(a, &x, &res) < 0) {
        free(f);
        eng_release(d->eng, slot);
        attempt_end(a, db, &res, clock_wall());
        return;
    }
    f->d = d;
    f->a = a;
    eng_submit(d->eng, slot, x, on_call_end, f);
}

/* A born reservation still queued when this replica stops: nothing of it was begun, so it is
 * given back (prepared, unowned, due now) for another replica rather than sent while stopping. */
static void give_back(const struct cfg *cfg, struct db *db, struct store_claim *c,
                      double claimed_mono, void *arg)
{
    struct dispatcher *d = arg;
    if (!c->born) {
        dispatch_one(cfg, db, c, claimed_mono, arg);
        return;
    }
    eng_release(d->eng, slot_of(cfg, c->provider));
    int released = 0, tripped = 0;
    if (lease_release_reservation(db, c, 0, &released, &tripped) < 0)
        LOG(LOG_WARN, "reservation_kept", LS("job_id", c->id),
            LS("note", "still prepared: due again when its reservation ends"));
    else if (released)
        LOG(LOG_INFO, "reservation_given_back", LS("job_id", c->id));
}

static void disp_free(struct dispatcher *d)
{
    rq_free(d->results);
    free(d);
}

struct dispatcher *disp_start(const struct cfg *cfg, struct eng *eng)
{
    struct dispatcher *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    d->cfg = cfg;
    d->eng = eng;
    if (!(d->results = rq_new())) {
        free(d);
        return NULL;
    }
    struct wpool_spec spec = {.name = "dispatch",
                              .claim_arg = claim_with_room,
                              .work = dispatch_one,
                              .idle_ms = cfg->poll_interval_ms,
                              .error_ms = ERROR_WAIT_MS,
                              /* New work wakes an idle worker: from this replica in
                               * process, from the others by their signaller (wake.h). */
                              .channel = WAKE_WORK_CHANNEL,
                              .wake_on_work = 1,
                              .give_back = give_back,
                              .arg = d,
                              .chores = write_results,
                              .chores_fd = rq_fd(d->results),
                              .room_outside = 1};
    d->pool = wpool_start(cfg, cfg->dispatch_workers, &spec);
    if (!d->pool) {
        disp_free(d);
        return NULL;
    }
    return d;
}

int disp_reserve(struct dispatcher *d, const char *provider)
{
    return d && d->cfg->dispatch_workers > 0 && eng_acquire(d->eng, slot_of(d->cfg, provider));
}

void disp_unreserve(struct dispatcher *d, const char *provider)
{
    if (d)
        eng_release(d->eng, slot_of(d->cfg, provider));
}

int disp_handoff(struct dispatcher *d, struct store_claim *c, double claimed_mono)
{
    return wpool_handoff(d->pool, c, claimed_mono);
}

void disp_quiesce(struct dispatcher *d)
{
    if (!d)
        return;
    wpool_quiesce(d->pool);
    LOG(LOG_INFO, "dispatch_draining", LI("calls_in_flight", eng_inflight(d->eng)));
}

void disp_stop(struct dispatcher *d)
{
    if (!d)
        return;
    wpool_stop(d->pool);
    disp_free(d);
}
