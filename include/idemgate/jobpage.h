#ifndef IDEMGATE_JOBPAGE_H
#define IDEMGATE_JOBPAGE_H

#include <stddef.h>

/* Paging of a tenant's job list (GET /v1/jobs): newest first, by (created_at, id), with a
 * cursor that names the last job of a page. Pure. */

/* The query parameters GET /v1/jobs takes; NULL-terminated. */
extern const char *const jobpage_params[];

/* The longest cursor: a created_at stamp (27), '~', a job id (at most 64). */
#define JOBPAGE_CURSOR_LEN 96

/* The result bodies a page holds at most (after its first job): a page of 1 000 jobs whose
 * bodies are megabytes of base64 images was held whole in memory, several times over, by one
 * request. A page cut by them says has_more, as one cut by its limit. The statements that read
 * a page cut it too (store.c, PAGE_CUT): they answer the rows up to the first past this bound. */
#define JOBPAGE_BODY_BYTES 8388608

/* Whether a job arriving after n jobs whose result bodies hold `bytes` is past the page of
 * `limit`: then has_more is set and the job is not in the page. Pure. */
int jobpage_past(int n, int limit, size_t bytes);

/* The cursor after the job created at `stamp` (RFC 3339 UTC with microseconds, store_stamp)
 * with id `id`, into out. -1 when either is not of that shape. */
int jobpage_cursor(const char *stamp, const char *id, char out[JOBPAGE_CURSOR_LEN]);

/* Splits cursor c into its stamp (27 characters and NUL) and job id. -1 when c is not a cursor
 * jobpage_cursor could have made. */
int jobpage_cursor_parse(const char *c, char stamp[28], char id[65]);

#endif
