#ifndef IDEMGATE_ANSWERS_H
#define IDEMGATE_ANSWERS_H

#include "idemgate/jobcache.h"
#include "idemgate/states.h"

#include <stddef.h>

/* The provider's answer of a job that ended on this replica, kept in memory for the clients
 * waiting on it (`Prefer: wait`): the writer of the result puts it here after its commit and
 * before it wakes the waiters, and a woken waiter answers from it without reading the database.
 * What is kept is exactly what the committed row holds: the terminal state written, the
 * provider's status, headers and body. An answer is found by job id alone, so only a waiter (a
 * client that proved it owns the job at intake) may ask for it; it lives in the job cache
 * (jobcache.h: bounded, expiring; a miss reads the database as before). */

/* Keeps the answer of job_id, just committed in state st with the provider's http_status,
 * resp_headers (a JSON object of the stored headers; its "content-type" is the answer's) and
 * body. Does nothing but for a success (completed, a 2xx, a body): a failure's answer says why,
 * from the job's document, which a read gives. */
void answers_put(const char *job_id, enum op_state st, int http_status, const char *resp_headers,
                 const void *body, size_t body_len);

/* Fills *out with a copy of job_id's kept answer (free with jobcache_entry_fini): 1, or 0 when
 * there is none. out->job_json is empty: the answer is the provider's, never the job view. */
__attribute__((warn_unused_result)) int answers_get(const char *job_id,
                                                    struct jobcache_entry *out);

#endif
