#ifndef IDEMGATE_WPOOL_H
#define IDEMGATE_WPOOL_H

#include "idemgate/config.h"

struct db;

/* A pool of worker threads, each with its own database connection, repeatedly calling a step
 * function: one claim and the work on it. A step that found nothing to do returns 0 and the
 * thread sleeps idle_ms (in short slices, so stopping is prompt); otherwise it goes again. */

typedef int (*wpool_step_fn)(const struct cfg *cfg, struct db *db);

struct wpool;

/* Starts n threads (none when n is 0). NULL only on failure. */
struct wpool *wpool_start(const struct cfg *cfg, int n, wpool_step_fn step, int idle_ms);
/* Lets each thread finish its step and joins them all. */
void wpool_stop(struct wpool *p);

#endif
