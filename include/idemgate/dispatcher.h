#ifndef IDEMGATE_DISPATCHER_H
#define IDEMGATE_DISPATCHER_H

#include "idemgate/config.h"
#include "idemgate/engine.h"
#include "idemgate/lease.h"

/* The dispatcher: prepared → sending (committed before the network call) → outcome, without
 * holding a thread or a database connection while a provider thinks. dispatch_workers threads,
 * each with one database connection, claim due creates (short statements), hand each call to the
 * call engine (engine.h: thousands in flight on call_threads threads) and write the results of
 * the calls that ended. They LISTEN for new work and fall back to polling. */

struct dispatcher;

/* Starts cfg->dispatch_workers threads (none when 0) making their calls on eng. NULL on
 * failure. */
struct credwatch;
/* cw (credwatch.h, the caller's, outliving it): whose credentials can be read here. */
struct dispatcher *disp_start(const struct cfg *cfg, struct eng *eng, struct credwatch *cw);
/* The stop, in three steps with the engine's: disp_quiesce (no new claim; born reservations not
 * begun are given back), then eng_stop (every call in flight ends, the threads writing results
 * meanwhile), then disp_stop (the results left are written; the threads stop). No call in flight
 * is dropped. */
void disp_quiesce(struct dispatcher *d);
void disp_stop(struct dispatcher *d);

/* One commit before send: the recorder asks for a call slot per new row (disp_reserve: 1 when
 * the engine, and the row's provider, have room and its credential can be read on this replica
 * (credwatch.h); d may be NULL), records those rows born
 * claimed, hands each claim over (disp_handoff: a dispatcher thread begins it at once; c is
 * moved, and freed by the dispatcher) and gives back the slots of rows that were not recorded
 * born (disp_unreserve). disp_handoff returns -1 when out of memory: c, and its slot, are then
 * the caller's. */
int disp_reserve(struct dispatcher *d, const char *provider);
void disp_unreserve(struct dispatcher *d, const char *provider);
__attribute__((warn_unused_result)) int disp_handoff(struct dispatcher *d, struct store_claim *c,
                                                     double claimed_mono);

#endif
