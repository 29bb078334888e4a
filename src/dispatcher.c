#include "idemgate/dispatcher.h"

#include "idemgate/attempt.h"
#include "idemgate/crash.h"
#include "idemgate/lease.h"
#include "idemgate/log.h"
#include "idemgate/wake.h"
#include "idemgate/wpool.h"

#include <stdlib.h>

/* The pause after the database refused a claim (or is being migrated). */
#define ERROR_WAIT_MS 200

struct dispatcher {
    struct wpool *pool;
};

static void dispatch_one(const struct cfg *cfg, struct db *db, struct store_claim *c,
                         double claimed_mono)
{
    CRASH_POINT("after_sending_commit");
    attempt_create(cfg, db, c, claimed_mono);
}

/* A born reservation still queued when this replica stops: nothing of it was begun, so it is
 * given back (prepared, unowned, due now) for another replica rather than sent while stopping. */
static void give_back(const struct cfg *cfg, struct db *db, struct store_claim *c,
                      double claimed_mono)
{
    (void)claimed_mono;
    if (!c->born) {
        attempt_create(cfg, db, c, claimed_mono);
        return;
    }
    int released = 0, tripped = 0;
    if (lease_release_reservation(db, c, 0, &released, &tripped) < 0)
        LOG(LOG_WARN, "reservation_kept", LS("job_id", c->id),
            LS("note", "still prepared: due again when its reservation ends"));
    else if (released)
        LOG(LOG_INFO, "reservation_given_back", LS("job_id", c->id));
}

struct dispatcher *disp_start(const struct cfg *cfg)
{
    struct dispatcher *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    struct wpool_spec spec = {.name = "dispatch",
                              .claim = store_claim,
                              .work = dispatch_one,
                              .idle_ms = cfg->poll_interval_ms,
                              .error_ms = ERROR_WAIT_MS,
                              /* New work wakes an idle worker: from this replica in
                               * process, from the others by their signaller (wake.h). */
                              .channel = WAKE_WORK_CHANNEL,
                              .wake_on_work = 1,
                              .give_back = give_back};
    d->pool = wpool_start(cfg, cfg->dispatch_workers, &spec);
    if (!d->pool) {
        free(d);
        return NULL;
    }
    return d;
}

int disp_reserve(struct dispatcher *d, int n)
{
    return d ? wpool_reserve(d->pool, n) : 0;
}

void disp_unreserve(struct dispatcher *d, int n)
{
    if (d)
        wpool_unreserve(d->pool, n);
}

int disp_handoff(struct dispatcher *d, struct store_claim *c, double claimed_mono)
{
    return wpool_handoff(d->pool, c, claimed_mono);
}

void disp_stop(struct dispatcher *d)
{
    if (!d)
        return;
    wpool_stop(d->pool);
    free(d);
}
