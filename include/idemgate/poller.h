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

/* Collects the outputs of a finished task from its status (or fetched result) answer doc into the
 * array out, as [{"url":…,"expires_at":…}] (or {"kind":"b64","bytes":…}), by the profile's
 * result paths; a binary_endpoint profile gives the one content URL of remote_id. Returns how
 * many were added. doc may be NULL. Pure but for the clock (the default expiry). */
int poller_outputs(const struct cfg_provider *p, const cJSON *doc, const char *remote_id,
                   cJSON *out);

#endif
