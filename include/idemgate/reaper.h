#ifndef IDEMGATE_REAPER_H
#define IDEMGATE_REAPER_H

#include "idemgate/config.h"

/* The reaper: `sending` operations whose lease expired (their worker died or froze) become
 * `unknown`, because nobody can know whether their bytes left. One thread per replica; several
 * replicas reaping at once share the work through SKIP LOCKED. */

struct reaper;

/* Starts the thread; NULL when cfg->reaper_interval_ms is 0 (disabled) or on failure. */
struct reaper *reaper_start(const struct cfg *cfg);
void reaper_stop(struct reaper *r);

#endif
