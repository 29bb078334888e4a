#ifndef IDEMGATE_POLLER_H
#define IDEMGATE_POLLER_H

#include "idemgate/config.h"
#include "idemgate/wpool.h"
#include "idemgate/profile.h"

/* Poller workers: accepted → (status read through the profile) → completed | failed | still
 * running. They also send a requested cancel, once. At the poll deadline they stop reading:
 * the job stays accepted with its remote id (a stopped wait is not a failure). */

/* Starts cfg->poll_workers threads; stop them with wpool_stop. */
struct wpool *poller_start(const struct cfg *cfg);

/* The canonical task status an answer shows, by the profile's rules: its status path and map,
 * its done flag and error, or its HTTP status. -1 when it cannot tell. Pure. */
int poller_status_of(const struct cfg_provider *p, int http_status, const cJSON *doc);

#endif
