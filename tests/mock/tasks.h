/*
 * idemgate-mock: the provider's task endpoints, which the gateway reconciles against.
 *
 * When a create's answer is lost, the gateway must find out whether the provider made the
 * task before it may send the create again.  Providers offer two ways, and every
 * personality here offers both: a lookup by the client reference the create carried, and
 * a list of recent tasks the gateway matches the reference in.  The tasks themselves live
 * in the ledger (ledger.h).
 *
 * /_config switches let a test model a provider that lacks an endpoint (it then answers
 * 404 no_such_endpoint) or whose endpoint fails (a fixed error status).  The switches are
 * rows of the table in tasks.c and apply to every personality.
 */
#ifndef IDEMGATE_MOCK_TASKS_H
#define IDEMGATE_MOCK_TASKS_H

#include <stdbool.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "mock.h"
#include "providers.h"

/* Longest error message tasks_config_apply() produces, including the terminating NUL. */
#define TASKS_ERR_MAX 160

/*
 * GET <lookup prefix>{ref}[?all=1]: answers the newest task of personality p whose client
 * reference is ref, or 404 not_found; with all=1, {"object": "list", "data": [...]} of
 * every such task, newest first.
 */
enum MHD_Result tasks_handle_lookup(struct mock_request *req, const struct mock_personality *p,
                                    const char *ref);

/*
 * GET <list path>?since=&until=&limit=: answers {"object": "list", "data": [...]} with the
 * newest tasks of personality p first.  A malformed parameter gets 400.
 */
enum MHD_Result tasks_handle_list(struct mock_request *req, const struct mock_personality *p);

/* The since/until/limit parameters of a list request. */
struct tasks_window {
    bool has_since;
    long long since;
    bool has_until;
    long long until;
    size_t limit;
};

/*
 * Answers the request in *ret and returns true when the /_config settings switch the list
 * endpoints off or make them fail, or a parameter is malformed (400 invalid_parameter);
 * otherwise fills *w (limit 1..1000, default 100) and returns false.
 */
bool tasks_list_refused(struct mock_request *req, struct tasks_window *w, enum MHD_Result *ret);

/*
 * Applies a /_config document such as {"lookup": false, "list_status": 503}, all of it or,
 * when a key is unknown or a value invalid, none of it; err (TASKS_ERR_MAX bytes) then
 * says why and false is returned.
 */
bool tasks_config_apply(const cJSON *doc, char *err);

/* Returns every setting as a JSON object, or NULL when memory ran out. */
cJSON *tasks_config_to_json(void);

/* Restores every setting to its initial value; main() calls it once before serving. */
void tasks_config_reset(void);

#endif
