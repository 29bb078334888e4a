#ifndef IDEMGATE_ARCHREADY_H
#define IDEMGATE_ARCHREADY_H

#include "idemgate/config.h"

#include <stddef.h>

/* Whether this replica's archive can take copies, for /readyz and /metrics (issue 21 item 13):
 * a replica whose archive folder or bucket cannot be written must not say it is ready. The
 * store is probed (blob_probe: a small file, and for s3 a small object, written and removed) at
 * most once every ARCHREADY_TTL_MS; the callers in between get the cached verdict. A change of
 * verdict is logged once (archive_unwritable / archive_writable). */

#define ARCHREADY_TTL_MS 5000

enum archready_state {
    ARCHREADY_NOT_USED = 0, /* this replica copies nothing: no archive worker (archive_workers
                               0), or no provider; the archive is not probed */
    ARCHREADY_WRITABLE,
    ARCHREADY_UNWRITABLE,
};

/* Whether a replica with this configuration copies outputs. Pure. */
int archready_used(const struct cfg *cfg);

/* The verdict, probing the store when the cached one is older than ARCHREADY_TTL_MS (or absent);
 * why (may be NULL) receives the reason when unwritable. Blocks during a probe (at most a few
 * seconds): only on a database worker, never on a server thread. Thread-safe. */
enum archready_state archready_check(const struct cfg *cfg, char *why, size_t whylen);

/* Whether a verdict of age_ms milliseconds (age_ms < 0: none yet) must be probed again. Pure. */
int archready_stale(long long age_ms);

#endif
