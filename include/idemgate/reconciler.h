#ifndef IDEMGATE_RECONCILER_H
#define IDEMGATE_RECONCILER_H

#include "idemgate/config.h"
#include "idemgate/wpool.h"

/* Reconciler workers: unknown → accepted/completed (found), prepared (proven absent), sending
 * (a resend under the same provider idempotency key), or review (an operator decides). Nothing
 * is ever resent without proof, except under a provider idempotency key. */

/* Starts cfg->reconcile_workers threads; stop them with wpool_stop. */
struct wpool *recon_start(const struct cfg *cfg);

/* What a reconcile look concluded, before it is written. Pure. */
enum recon_verdict {
    RV_FOUND,   /* exactly one task carries our reference */
    RV_ABSENT,  /* proven absent: safe to send */
    RV_LATER,   /* cannot tell yet: look again */
    RV_REVIEW,  /* ambiguous for good: an operator decides */
};

/* list_match: matches = tasks carrying our reference (-1 when the list call failed);
 * window_closed = the recovery window (from the first send) is over. */
enum recon_verdict recon_list_verdict(int matches, int window_closed);
/* get_by_client_id: status of the lookup (0 when it failed without an answer). */
enum recon_verdict recon_lookup_verdict(int http_status, int window_closed);

#endif
