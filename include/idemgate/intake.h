#ifndef IDEMGATE_INTAKE_H
#define IDEMGATE_INTAKE_H

#include "idemgate/http_server.h"
#include "idemgate/api.h"

#include <stddef.h>

/* POST /v1/providers/{provider}/{route} (DESIGN.md §1): the intake as named steps over one
 * struct intake, in this order: authenticate → validate → canonicalise → fingerprint → cache →
 * record → recorded → answer. The first step that answers ends the request. `record` hands the
 * intent to the recorder (group commit, recorder.h) and suspends the request, so no server
 * thread waits on the database; `recorded` goes on once the commit returned. Every 4xx a step
 * raises passes through one gate that proves the caller a tenant first, so an unauthenticated
 * client learns nothing about routes or validation, whatever the step. */

/* The route handler (a->tail is "{provider}/{route}"). */
void intake_handle(struct hs_req *r, const struct api_args *a);

/* The second call of a request suspended by `Prefer: wait`: reads its job again and answers. */
void intake_resume(struct hs_req *r);

/* The steps' names in the order they run (NULL past the last); for logs and tests. */
const char *intake_step_name(size_t i);


#endif
