#ifndef IDEMGATE_DISPATCHER_H
#define IDEMGATE_DISPATCHER_H

#include "idemgate/config.h"

/* Dispatcher workers: prepared → sending (committed before the network call) → outcome.
 * Each worker owns one database connection, LISTENs for new work and falls back to polling. */

struct dispatcher;

/* Starts cfg->dispatch_workers threads (none when 0). Returns NULL on failure. */
struct dispatcher *disp_start(const struct cfg *cfg);
/* Asks the workers to stop, lets each finish the call it is making (its result is written), and
 * joins them. */
void disp_stop(struct dispatcher *d);

#endif
