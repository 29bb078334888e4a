#ifndef IDEMGATE_RECORDER_H
#define IDEMGATE_RECORDER_H

#include "idemgate/config.h"
#include "idemgate/store.h"

/* The intent recorder: group commit for intake (DESIGN.md §1, "record"). Server threads never
 * wait on the database to record an intent: they queue it here and suspend the request. A few
 * writer threads, each with its own connection, take whatever has queued up (at most
 * intake_batch_max intents), record them with store_intake_batch — one transaction, one round
 * trip, one WAL flush — and call each item's done callback once the commit that holds its row
 * returned. Nothing waits to fill a batch: while one commits, the next gathers — for that writer's
 * next commit: another writer takes it only when a whole batch waits or the oldest intent has
 * waited GC_STALL_MS (gcommit.h). */

struct recorder;

struct rec_item {
    struct store_intake_item in; /* the intake; its answer once done() is called */
    /* Called exactly once, on a writer thread, when in.err/in.job/in.created are final. */
    void (*done)(struct rec_item *it);
    /* Set before done() when the row was born claimed and handed to this replica's dispatcher:
     * its call, and the live stream the call feeds, are the attempt's from then on. */
    int handed_over;
    struct rec_item *next; /* the recorder's */
    double queued_mono;    /* the recorder's: clock_mono() when submitted */
};

struct dispatcher;

/* Starts cfg->intake_writers writer threads. With disp, new rows are recorded born claimed while
 * disp's call engine has room for their calls, and handed to it after the commit (one commit
 * before send). NULL when it cannot start. */
__attribute__((warn_unused_result)) struct recorder *recorder_start(const struct cfg *cfg,
                                                                    struct dispatcher *disp);

/* Queues it. 0: it->done(it) will be called exactly once, from a writer thread. -1: the
 * recorder is closed (the caller records the intent itself). */
__attribute__((warn_unused_result)) int recorder_submit(struct recorder *rec, struct rec_item *it);

/* Refuses new items, records every queued one (their done callbacks called), stops the writer
 * threads. The structure stays valid: recorder_submit then answers -1. Accepts NULL; a second
 * call does nothing. */
void recorder_close(struct recorder *rec);
/* Frees the recorder, closing it first if needed; only once no thread can submit (after
 * hs_stop). Accepts NULL. */
void recorder_free(struct recorder *rec);

#endif
