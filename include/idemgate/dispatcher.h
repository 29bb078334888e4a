#ifndef IDEMGATE_DISPATCHER_H
#define IDEMGATE_DISPATCHER_H

#include "idemgate/config.h"
#include "idemgate/lease.h"

/* Dispatcher workers: prepared → sending (committed before the network call) → outcome.
 * Each worker owns one database connection, LISTENs for new work and falls back to polling. */

struct dispatcher;

/* Starts cfg->dispatch_workers threads (none when 0). Returns NULL on failure. */
struct dispatcher *disp_start(const struct cfg *cfg);
/* Asks the workers to stop, lets each finish the call it is making (its result is written), and
 * joins them. */
void disp_stop(struct dispatcher *d);

/* One commit before send: the recorder asks for idle workers (disp_reserve, up to n; d may be
 * NULL), records that many new rows born claimed, hands each claim over (disp_handoff: the worker
 * sends at once; c is moved, and freed by the dispatcher) and gives back the rest
 * (disp_unreserve). disp_handoff returns -1 when out of memory: c is then the caller's. */
int disp_reserve(struct dispatcher *d, int n);
void disp_unreserve(struct dispatcher *d, int n);
__attribute__((warn_unused_result)) int disp_handoff(struct dispatcher *d, struct store_claim *c,
                                                     double claimed_mono);

#endif
