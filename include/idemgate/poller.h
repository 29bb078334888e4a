#ifndef IDEMGATE_POLLER_H
#define IDEMGATE_POLLER_H

#include "idemgate/config.h"
#include "idemgate/wpool.h"
#include "idemgate/profile.h"

/* The poller: accepted → (status read through the profile) → completed | failed | canceled |
 * still running. It also sends a requested cancel, once. Past the poll deadline a read that does
 * not show the task's end hands the job to an operator (review, with its remote id; a cancel, a
 * verified webhook or the admin's resume takes it back to accepted). poll_workers
 * threads, each with one database connection, claim due reads (while the call engine has room)
 * and write what they showed; the reads themselves run on the call engine (engine.h), holding no
 * thread and no connection. */

struct poller;
struct eng;

/* Starts cfg->poll_workers threads (none when 0) making their reads on eng. NULL on failure. */
struct credwatch;
/* cw (credwatch.h, the caller's, outliving it): a provider whose credential cannot be read here
 * is not polled here (its reads would all be unreadable, and an overdue one sent to review). */
struct poller *poller_start(const struct cfg *cfg, struct eng *eng, struct credwatch *cw);
/* The stop, like the dispatcher's: poller_quiesce (no new claim), eng_stop (the reads in flight
 * end), poller_stop (their conclusions are written; the threads stop). */
void poller_quiesce(struct poller *pl);
void poller_stop(struct poller *pl);

/* Collects the outputs of a finished task from its status (or fetched result) answer doc into the
 * array out, as [{"url":…,"expires_at":…}] (or {"kind":"b64","bytes":…}), by the profile's
 * result paths; a binary_endpoint profile gives the one content URL of remote_id. Returns how
 * many were added. doc may be NULL. Pure but for the clock (the default expiry). */
int poller_outputs(const struct cfg_provider *p, const cJSON *doc, const char *remote_id,
                   cJSON *out);

#endif
