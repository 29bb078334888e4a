#include "idemgate/dispatcher.h"

#include "idemgate/livestream.h"

#include "idemgate/attempt.h"
#include "idemgate/clock.h"
#include "idemgate/crash.h"
#include "idemgate/credwatch.h"
#include "idemgate/engine.h"
#include "idemgate/gcommit.h"
#include "idemgate/lease.h"
#include "idemgate/log.h"
#include "idemgate/resultq.h"
#include "idemgate/wake.h"
#include "idemgate/wpool.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* The pause after the database refused a claim (or is being migrated). */
#define ERROR_WAIT_MS 200
/* Born reservations started, or results written, in one commit. */
#define BATCH 64

/* One create in the engine: allocated before the call, so that its end is never lost to a
 * failed allocation; its result is written by whichever dispatcher thread takes it. */
struct flight {
    struct rq_item node;
    struct dispatcher *d;
    struct attempt *a;
    int slot; /* the engine slot of the create, held until its outcome is written */
    struct up_response res;
    double t1; /* wall clock when the call ended */
};

/* A born reservation handed over by the recorder, waiting for its start statement. */
struct born {
    struct rq_item node;
    struct store_claim c;
    double claimed_mono;
};

struct dispatcher {
    const struct cfg *cfg;
    struct wpool *pool;
    struct eng *eng;
    struct credwatch *cw; /* whose credentials can be read here (credwatch.h) */
    struct rq *results;  /* calls that ended; its fd also says born reservations wait */
    struct rq *born;     /* born reservations handed over */
    atomic_int starved;  /* the last claim found the engine full */
    atomic_int stopping; /* disp_quiesce: born reservations are given back, not begun */
    atomic_int writing;  /* threads doing chores now (gcommit.h) */
    char *stamps; /* each provider's profile stamp, a JSON object: kept by what it claims */
};

/* The engine slot of a provider: its index in the configuration, -1 when not configured here. */
static int slot_of(const struct cfg *cfg, const char *provider)
{
    const struct cfg_provider *p =
        provider ? cfg_find_provider(cfg, provider, strlen(provider)) : NULL;
    return p ? (int)(p - cfg->providers) : -1;
}

/* Runs on an engine thread: the call ended; its answer is queued for a dispatcher thread (which
 * holds a database connection) to classify and write. Nothing heavy runs here: a large answer
 * must not hold up the other calls of this engine thread. */
static void on_call_end(void *arg, struct up_response *res)
{
    struct flight *f = arg;
    f->res = *res;
    f->t1 = clock_wall();
    rq_push(f->d->results, &f->node);
}

/* Runs on an engine thread: the credential probe a refusal asked for ended; the result is
 * queued again, now to be written. */
static void on_probe_end(void *arg, struct up_response *res)
{
    struct flight *f = arg;
    attempt_probed(f->a, res);
    rq_push(f->d->results, &f->node);
}

static void dispatch_one(const struct cfg *cfg, struct db *db, struct store_claim *c,
                         double claimed_mono, void *arg);
static void give_back(const struct cfg *cfg, struct db *db, struct store_claim *c,
                      double claimed_mono, void *arg);

/* Answers held for one commit at most (beyond one answer): a batch of long streams' records is
 * written in several commits rather than held in memory all at once. */
#define BATCH_BYTES (8u << 20)

/* Writes k results in one commit (store_finish_many) and lets their attempts go. */
static void write_batch(struct dispatcher *d, struct db *db, struct flight **v,
                        const struct store_finish **fs, int k)
{
    int applied[BATCH], errors[BATCH];
    if (k == 1)
        errors[0] = store_finish(db, fs[0], &applied[0]);
    else if (k > 1)
        (void)store_finish_many(db, fs, (size_t)k, applied, errors);
    for (int i = 0; i < k; i++) {
        attempt_recorded(v[i]->a, errors[i], applied[i]);
        eng_release(d->eng, v[i]->slot); /* the outcome (and any trip) is written: room again */
        free(v[i]);
    }
}

/* Writes the results of up to BATCH ended calls, in one commit while their answers stay under
 * BATCH_BYTES; 1 when there were any. */
static int write_results(struct dispatcher *d, struct db *db)
{
    struct flight *v[BATCH];
    const struct store_finish *fs[BATCH];
    int n = 0, k = 0;
    size_t bytes = 0;
    struct rq_item *next;
    for (struct rq_item *it = rq_take(d->results, BATCH, &n); it; it = next) {
        next = it->next; /* a probe submitted below may queue it again at once */
        if (it->write) { /* a note of a call in flight (attempt_note_ids), not its end */
            it->write(it, db);
            continue;
        }
        struct flight *f = (struct flight *)it;
        const struct store_finish *fin =
            attempt_ready(f->a, db, d->eng, &f->res, f->t1, on_probe_end, f);
        if (!fin)
            continue;
        fs[k] = fin;
        v[k++] = f;
        bytes += fin->resp_body_len;
        if (bytes >= BATCH_BYTES) {
            write_batch(d, db, v, fs, k);
            k = 0;
            bytes = 0;
        }
    }
    write_batch(d, db, v, fs, k);
    return n > 0;
}

/* Starts the calls of up to BATCH born reservations: one commit moves them all to `sending`
 * (each only if still ours, not cancelled, its credential not tripped), then each call goes to
 * the engine. Stopping, they are given back instead. 1 when there were any. */
static int begin_born(struct dispatcher *d, struct db *db)
{
    struct born *v[BATCH];
    struct store_claim *cs[BATCH];
    int begun[BATCH], n = 0, k = 0;
    for (struct rq_item *it = rq_take(d->born, BATCH, &n); it; it = it->next)
        v[k++] = (struct born *)it;
    if (!k)
        return 0;
    if (atomic_load(&d->stopping)) {
        for (int i = 0; i < k; i++) {
            give_back(d->cfg, db, &v[i]->c, v[i]->claimed_mono, d);
            store_claim_fini(&v[i]->c);
            free(v[i]);
        }
        return 1;
    }
    double before = clock_mono(); /* the leases count from the statement that moves them */
    for (int i = 0; i < k; i++) {
        CRASH_POINT("before_begin_send");
        cs[i] = &v[i]->c;
    }
    (void)attempt_begin_born_many(d->cfg, db, cs, (size_t)k, begun);
    for (int i = 0; i < k; i++) {
        if (begun[i])
            dispatch_one(d->cfg, db, &v[i]->c, before, d);
        else
            eng_release(d->eng, slot_of(d->cfg, v[i]->c.provider));
        store_claim_fini(&v[i]->c);
        free(v[i]);
    }
    return 1;
}

/* How many chores wait (born reservations and results), and how long the oldest has (ms). */
static size_t chores_waiting(struct dispatcher *d, double *oldest_ms)
{
    double born_age, results_age;
    size_t queued = rq_waiting(d->born, &born_age) + rq_waiting(d->results, &results_age);
    *oldest_ms = born_age > results_age ? born_age : results_age;
    return queued;
}

/* A dispatcher thread's chores: born reservations first (their leases run), then results.
 * Group commit (gcommit.h): while another thread does them, what arrives is its next batch
 * unless a whole batch waits or the oldest has waited GC_STALL_MS (this thread looks again when
 * it next comes round: the next item pushed, or its idle wait's end). */
static int chores(struct db *db, void *arg)
{
    struct dispatcher *d = arg;
    rq_drain_fd(d->results);
    double age;
    size_t queued = chores_waiting(d, &age);
    if (!gc_take(atomic_load(&d->writing), queued, BATCH, age))
        return 0;
    atomic_fetch_add(&d->writing, 1);
    int a = begin_born(d, db);
    int b = write_results(d, db);
    atomic_fetch_sub(&d->writing, 1);
    return a || b;
}

/* Chores waiting behind another thread's (chores declined them): due when their oldest has
 * waited GC_STALL_MS. */
static int disp_chores_due_ms(void *arg)
{
    struct dispatcher *d = arg;
    double age;
    if (!atomic_load(&d->writing) || !chores_waiting(d, &age))
        return -1;
    return age >= GC_STALL_MS ? 0 : (int)(GC_STALL_MS - age) + 1;
}

/* Whether provider slot i's credential cannot be read on this replica. */
static int credential_unreadable(int i, void *arg)
{
    return !cw_sendable(((struct dispatcher *)arg)->cw, i, clock_mono() * 1000);
}

/* Whether provider slot i's creates are not claimed now: at its own limit in the engine, or its
 * credential cannot be read on this replica (left to the replicas that can send them). */
static int provider_skipped(int i, void *arg)
{
    struct dispatcher *d = arg;
    return eng_provider_full(d->eng, i) || credential_unreadable(i, arg);
}

/* Claims one due create when the engine has room for its call; the slot is taken before the
 * claim and given back when nothing was claimed. */
static int claim_with_room(struct db *db, const char *owner, int lease_seconds,
                           struct store_claim *out, void *arg)
{
    struct dispatcher *d = arg;
    char providers[8192];
    /* No provider's credential readable here: nothing to claim until the next idle poll reads
     * them again. Not "starved": a slot taken and given back here would kick this thread again
     * at once, a spin for as long as the secrets are missing. */
    if (!cfg_providers_literal(d->cfg, credential_unreadable, d, providers, sizeof(providers)))
        return STORE_ENOTFOUND;
    /* starved is set before the engine is asked: a slot given back between a refusal and the
     * flag (disp_room, on another thread) would see it clear, kick nobody, and the slot stayed
     * idle until the next poll while work was due. */
    atomic_store(&d->starved, 1);
    if (!eng_acquire(d->eng, -1))
        return STORE_ENOTFOUND; /* full: a call's end wakes a thread to claim again */
    if (!cfg_providers_literal(d->cfg, provider_skipped, d, providers, sizeof(providers))) {
        eng_release(d->eng, -1); /* every provider at its own limit: a call's end wakes us */
        return STORE_ENOTFOUND;
    }
    atomic_store(&d->starved, 0);
    int e = store_claim(db, owner, lease_seconds, providers, d->stamps, out);
    if (e != STORE_OK) {
        eng_release(d->eng, -1);
        return e;
    }
    /* The slot is now the provider's too (a race between threads may pass the provider's own
     * limit by at most one call per dispatcher thread). */
    eng_assign(d->eng, slot_of(d->cfg, out->provider));
    CRASH_POINT("after_sending_commit");
    return e;
}

static int disp_starved(void *arg)
{
    return atomic_load(&((struct dispatcher *)arg)->starved);
}

/* A slot was given back (by any pool's call): a claim that found the engine full is made again. */
static void disp_room(void *arg)
{
    struct dispatcher *d = arg;
    if (atomic_load(&d->starved))
        rq_kick(d->results);
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
    if (attempt_begin(cfg, db, c, claimed_mono, &a) < 0) {
        eng_release(d->eng, slot);
        cw_recheck(d->cw, slot, clock_mono() * 1000); /* a credential gone: claims stop now */
        return;
    }
    struct flight *f = calloc(1, sizeof(*f));
    if (!f) {
        eng_release(d->eng, slot);
        attempt_abandon(a, db, "out of memory");
        return;
    }
    attempt_note_ids(a, d->results);
    if (attempt_xfer(a, &x, &res) < 0) {
        free(f);
        eng_release(d->eng, slot);
        attempt_end(a, db, &res, clock_wall());
        return;
    }
    f->d = d;
    f->a = a;
    f->slot = slot;
    eng_submit_held_ticked(d->eng, slot, x, on_call_end, f, attempt_tick, a);
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
    ls_close_unfed(c->id); /* not sent here: its clients wait for the job, wherever sent */
    int released = 0, tripped = 0;
    if (lease_release_reservation(db, c, 0, &released, &tripped) < 0)
        LOG(LOG_WARN, "reservation_kept", LS("job_id", c->id),
            LS("note", "still prepared: due again when its reservation ends"));
    else if (released) {
        LOG(LOG_INFO, "reservation_given_back", LS("job_id", c->id));
        wake_work(); /* due now for any replica: they are told, not left to their polls */
    }
}

static void disp_free(struct dispatcher *d)
{
    eng_room_off(d->eng, d);
    rq_free(d->results);
    rq_free(d->born);
    free(d->stamps);
    free(d);
}

/* {"<provider>": "<profile stamp>", …} of every configured provider (profile.h), or NULL when
 * out of memory. */
static char *stamps_json(const struct cfg *cfg)
{
    cJSON *o = cJSON_CreateObject();
    for (size_t i = 0; o && i < cfg->n_providers; i++)
        if (!cJSON_AddStringToObject(o, cfg->providers[i].name, cfg->providers[i].profile_stamp)) {
            cJSON_Delete(o);
            o = NULL;
        }
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return text;
}

struct dispatcher *disp_start(const struct cfg *cfg, struct eng *eng, struct credwatch *cw)
{
    struct dispatcher *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    d->cfg = cfg;
    d->eng = eng;
    d->cw = cw;
    if (!(d->results = rq_new()) || !(d->born = rq_new()) || !(d->stamps = stamps_json(cfg))) {
        disp_free(d);
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
                              .arg = d,
                              .chores = chores,
                              .chores_fd = rq_fd(d->results),
                              .starved = disp_starved,
                              .chores_due_ms = disp_chores_due_ms};
    eng_on_room(eng, disp_room, d);
    d->pool = wpool_start(cfg, cfg->dispatch_workers, &spec);
    if (!d->pool) {
        disp_free(d);
        return NULL;
    }
    return d;
}

int disp_reserve(struct dispatcher *d, const char *provider)
{
    if (!d || d->cfg->dispatch_workers <= 0)
        return 0;
    int slot = slot_of(d->cfg, provider);
    /* A provider whose credential cannot be read here is left to the other replicas: its row
     * is recorded unowned, due now, and this replica's claims skip it. */
    return cw_sendable(d->cw, slot, clock_mono() * 1000) && eng_acquire(d->eng, slot);
}

void disp_unreserve(struct dispatcher *d, const char *provider)
{
    if (d)
        eng_release(d->eng, slot_of(d->cfg, provider));
}

int disp_handoff(struct dispatcher *d, struct store_claim *c, double claimed_mono)
{
    struct born *b = malloc(sizeof(*b));
    if (!b)
        return -1;
    b->c = *c;
    b->claimed_mono = claimed_mono;
    memset(c, 0, sizeof(*c));
    rq_push(d->born, &b->node);
    rq_kick(d->results); /* the fd the threads wait on */
    return 0;
}

void disp_quiesce(struct dispatcher *d)
{
    if (!d)
        return;
    atomic_store(&d->stopping, 1);
    rq_kick(d->results); /* born reservations still queued are given back now */
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
