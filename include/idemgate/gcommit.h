#ifndef IDEMGATE_GCOMMIT_H
#define IDEMGATE_GCOMMIT_H

#include <stddef.h>

/* Group commit across several writer threads (the recorder's intake writers, the dispatcher's
 * threads writing results): whether a writer takes what waits in its queue now. One writer at a
 * time takes it, so that what arrives while it commits waits for its next commit — one commit of
 * many rows rather than many commits of a few, racing for the same index pages. A second writer
 * takes it as well when a whole batch waits (one writer no longer keeps up), or when the oldest
 * item has waited GC_STALL_MS (the writer is held up: a lock, a slow disk, a lost connection —
 * the others' rows are not held up with it). Pure: writing is how many writers are taking or
 * writing now, queued how many items wait, batch the most one commit takes, oldest_age_ms how
 * long the oldest has waited. */

/* How long the oldest item may wait behind a busy writer before another writer takes it. */
#define GC_STALL_MS 20.0

int gc_take(int writing, size_t queued, size_t batch, double oldest_age_ms);

#endif
