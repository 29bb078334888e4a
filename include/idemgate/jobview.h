#ifndef IDEMGATE_JOBVIEW_H
#define IDEMGATE_JOBVIEW_H

#include "idemgate/store.h"

/* The client-facing JSON of a job (DESIGN.md §4). Returns a new NUL-terminated string (free()),
 * or NULL when out of memory. */
char *jobview_json(const struct store_job *j);

/* The value of header `name` (lowercase) among a job's stored provider headers, copied into
 * out; returns 0 or -1 when absent. */
int jobview_stored_header(const struct store_job *j, const char *name, char *out, size_t outlen);

#endif
