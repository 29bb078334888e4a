#ifndef IDEMGATE_JOBS_H
#define IDEMGATE_JOBS_H

#include "idemgate/http_server.h"
#include "idemgate/api.h"

/* A tenant's jobs (DESIGN.md §4); route handlers of routes.c. a->arg[0] is the job id. */

/* GET /v1/jobs/{id}: the job, from the cache when terminal. */
void jobs_get(struct hs_req *r, const struct api_args *a);
/* GET /v1/jobs?state=S&limit=N: the tenant's jobs, oldest first. */
void jobs_list(struct hs_req *r, const struct api_args *a);
/* POST /v1/jobs/{id}/cancel: idempotent; the provider's cancel is sent at most once. */
void jobs_cancel(struct hs_req *r, const struct api_args *a);
/* POST /v1/jobs/{id}/resolve: an operator's decision on a job in review. */
void jobs_resolve(struct hs_req *r, const struct api_args *a);
/* POST /v1/jobs/{id}/regenerate: a deliberate new paid creation, under its own key. */
void jobs_regenerate(struct hs_req *r, const struct api_args *a);

#endif
