#ifndef IDEMGATE_USAGE_H
#define IDEMGATE_USAGE_H

#include "idemgate/api.h"
#include "idemgate/store.h"

#include <cjson/cJSON.h>

/* GET /v1/usage?from=&to=&group_by=provider|route|day: what a tenant's completed operations
 * cost (the admin token: every tenant's), and its budget; `idemgate usage` prints the same
 * document. The query's checks and the document are pure; the handler runs on a database
 * worker. */

enum usage_group { UG_PROVIDER = 0, UG_ROUTE, UG_DAY };

struct usage_query {
    const char *from, *to; /* as given (validated), or NULL */
    enum usage_group group;
};

/* Checks a query: from and to each absent or a date (YYYY-MM-DD, UTC midnight) or an RFC 3339
 * timestamp (YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM)); group_by absent (provider) or
 * provider, route or day. Returns 0, or -1 with why in err. */
__attribute__((warn_unused_result)) int usage_query_parse(const char *from, const char *to,
                                                          const char *group_by,
                                                          struct usage_query *q, char *err,
                                                          size_t errlen);
const char *usage_group_name(enum usage_group g);

/* A new usage document for q: {"object": "usage", "from", "to", "group_by", "data": [],
 * "budgets": []}; usage_add adds one row of store_usage to it. */
cJSON *usage_doc_new(const struct usage_query *q);
void usage_add(const struct store_usage_row *row, void *doc);

/* The handler of GET /v1/usage (offloaded: on a database worker). */
void usage_get(struct hs_req *r, const struct api_args *a);

#endif
