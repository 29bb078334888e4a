#ifndef IDEMGATE_WPOOL_H
#define IDEMGATE_WPOOL_H

#include "idemgate/config.h"
#include "idemgate/lease.h"

/* A pool of worker threads, each with its own database connection, each claiming one operation
 * at a time and working on it: the dispatcher, the reconciler and the poller are three of them.
 * A thread that found nothing due waits idle_ms, or until another replica signals its LISTEN
 * channel, or (wake_on_work) until this replica calls wake_work (wake.h); one whose claim the
 * database refused waits error_ms. Stopping wakes every waiting thread at once and lets each
 * finish the operation it holds (its result is written). */

/* Claims one due operation into *out (see lease.h): STORE_OK, STORE_ENOTFOUND when nothing is
 * due, or another store error. */
typedef int (*wpool_claim_fn)(struct db *db, const char *owner, int lease_seconds,
                              struct store_claim *out);
/* Works on a claimed operation; claimed_mono is clock_mono() taken before the claim (the lease
 * is no older). The pool frees the claim afterwards. */
typedef void (*wpool_work_fn)(const struct cfg *cfg, struct db *db, struct store_claim *c,
                              double claimed_mono, void *arg);

struct wpool_spec {
    const char *name; /* for the log */
    wpool_claim_fn claim;
    wpool_work_fn work;
    int idle_ms;         /* the wait when nothing was due */
    int error_ms;        /* the wait after the database refused */
    const char *channel; /* LISTEN on it, and wake up on its NOTIFY while idle; or NULL.
                          * This replica's own signals (wake_is_echo) are ignored. */
    int wake_on_work;    /* also wake up on wake_work() in this process */
    void *arg; /* passed to work and the hooks below */
    /* For a pool whose work does not wait for its call (the dispatcher and the poller,
     * engine.h); all optional. claim_arg claims instead of claim. chores is work that is no claim
     * (born reservations to start, results of calls to write), in batches: it runs first on
     * every turn, and again while it returns 1, with a claim between two batches when one is
     * wanted; chores_fd is readable while some wait, and wakes one idle thread (one waits on it
     * at a time: the others take chores when they come round), which then also
     * claims when starved says a claim found no room (a call's end makes room for another). */
    int (*claim_arg)(struct db *db, const char *owner, int lease_seconds, struct store_claim *out,
                     void *arg);
    int (*chores)(struct db *db, void *arg);
    int chores_fd;
    /* Whether the last claim found no room (a chores wake-up then claims again); NULL: always. */
    int (*starved)(void *arg);
    /* In how many ms chores left waiting (declined while another thread does them) must be
     * looked at again though nothing new arrived; -1: none wait so. An idle wait ends then. */
    int (*chores_due_ms)(void *arg);
};

struct wpool;

/* Starts n threads (none when 0) working as spec says (spec is copied). NULL only on failure. */
struct wpool *wpool_start(const struct cfg *cfg, int n, const struct wpool_spec *spec);
/* Stops claiming: from now on only chores are done. wpool_stop follows. */
void wpool_quiesce(struct wpool *p);
/* Wakes the threads, lets each finish the operation it holds and its chores, and joins them
 * all. */
void wpool_stop(struct wpool *p);

#endif
