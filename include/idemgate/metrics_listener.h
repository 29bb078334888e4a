#ifndef IDEMGATE_METRICS_LISTENER_H
#define IDEMGATE_METRICS_LISTENER_H

#include "idemgate/api.h"
#include "idemgate/http_server.h"

/* The metrics listener (setting metrics_listen): a second HTTP server that answers only
 * GET/HEAD /metrics (admin_metrics_serve: behind metrics_token_sha256 when it is set), /healthz
 * and /readyz, and 404 to everything else. It lets a pod expose metrics to Prometheus on its IP
 * while the API stays on loopback. Its requests use the API's context (api.h): the same
 * database workers, counted and logged like the API's, with listener "metrics" in the log. */

/* Starts listening on cfg->metrics_listen_host:metrics_listen_port (api_config(a)). Returns
 * NULL when it cannot. Stop it like the API's server (hs_quiesce, hs_drain, hs_stop), before
 * the API's context and database workers are freed. */
__attribute__((warn_unused_result)) struct hs_server *ml_listen(struct api *a);

#endif
