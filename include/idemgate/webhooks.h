#ifndef IDEMGATE_WEBHOOKS_H
#define IDEMGATE_WEBHOOKS_H

#include "idemgate/http_server.h"
#include "idemgate/api.h"

/* POST /v1/webhooks/{provider} (a->tail): verify the signature, dedupe by event id, then treat
 * the delivery as a hint: the poller re-reads the task's status through the adapter and applies
 * a forward-only transition. The webhook's own body never changes a job. */
void webhooks_receive(struct hs_req *r, const struct api_args *a);

#endif
