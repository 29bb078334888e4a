#ifndef IDEMGATE_ADMIN_H
#define IDEMGATE_ADMIN_H

#include "idemgate/http_server.h"
#include "idemgate/api.h"

/* The operator's endpoints and the probes; route handlers of routes.c. */

/* POST /v1/admin/providers/{name}/reset: clears a tripped provider credential (admin token). */
void admin_reset(struct hs_req *r, const struct api_args *a);
/* POST /v1/admin/jobs/{id}/resume: polling of a job its poll deadline sent to review (or of an
 * accepted one) starts again, for one more hour (admin token). */
void admin_resume(struct hs_req *r, const struct api_args *a);
/* GET /v1/admin/jobs?state=&provider=&tenant=&idempotency_key=&limit=&starting_after=: every
 * tenant's jobs, newest first, a page at a time, each with its tenant's name (admin token). */
void admin_jobs_list(struct hs_req *r, const struct api_args *a);
/* GET /v1/admin/overview: jobs in doubt, jobs of the last 24 h by state, spend over 30 days by
 * provider and model with the budgets, time to complete per provider (admin token). */
void admin_overview(struct hs_req *r, const struct api_args *a);
/* GET /v1/admin/jobs/{id}/outputs/{n}: any tenant's archived output (admin token). */
void admin_job_output(struct hs_req *r, const struct api_args *a);
/* GET /v1/admin/jobs/{id}: any tenant's job and its attempt timeline (admin token). */
void admin_job_get(struct hs_req *r, const struct api_args *a);
/* GET /v1/admin/providers: every configured provider and its credential breaker (admin token). */
void admin_providers(struct hs_req *r, const struct api_args *a);
/* GET /healthz: the process answers. */
void admin_health(struct hs_req *r, const struct api_args *a);
/* GET /readyz: the database answers, the schema is the one this binary expects, no statement
 * class fails, the archive takes copies; with the failing statements and the tripped providers
 * (admin_ready_serve: the metrics listener's handler). admin_ready, on the API's listener, leaves
 * those two lists out when metrics have a listener of their own (metrics_listen), but for the
 * admin token. */
void admin_ready_serve(struct hs_req *r, const struct api_args *a);
void admin_ready(struct hs_req *r, const struct api_args *a);
/* GET /metrics: process counters (metrics.c) and gauges read from the database; with
 * metrics_token_sha256 set, only to that token or the admin token (401 otherwise). The metrics
 * listener's handler (metrics_listener.c). */
void admin_metrics_serve(struct hs_req *r, const struct api_args *a);
/* GET /metrics on the API's listener: admin_metrics_serve, or, when metrics_listen gives metrics
 * a listener of their own, 404 to all but the admin token. */
void admin_metrics(struct hs_req *r, const struct api_args *a);

#endif
