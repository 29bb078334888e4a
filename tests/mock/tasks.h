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
 * GET <task path>{id}: answers the task of personality p called id (the same object a
 * lookup answers), or 404 not_found, also while the task is not visible yet.
 */
enum MHD_Result tasks_handle_read(struct mock_request *req, const struct mock_personality *p,
                                  const char *id);

/*
 * GET <list path>?since=&until=&limit=&cursor=: answers {"object": "list", "data": [...],
 * "has_more", "next_cursor"} with the newest tasks of personality p first, one page.  A
 * malformed parameter gets 400.
 */
enum MHD_Result tasks_handle_list(struct mock_request *req, const struct mock_personality *p);

/* Bytes a list cursor takes, including the terminating NUL. */
#define TASKS_CURSOR_MAX 48

/* The since/until/limit/cursor parameters of a list request. */
struct tasks_window {
    bool has_since;
    long long since;
    bool has_until;
    long long until;
    size_t limit;
    const char *cursor; /* the "cursor" parameter, NULL when absent or empty: the first page */
};

/*
 * Answers the request in *ret and returns true when the /_config settings switch the list
 * endpoints off or make them fail, or make a page after the first fail (list_page_status),
 * or a parameter is malformed (400 invalid_parameter); otherwise fills *w (limit 1..1000,
 * default 100, capped by list_page_max) and returns false.
 */
bool tasks_list_refused(struct mock_request *req, struct tasks_window *w, enum MHD_Result *ret);

/*
 * Parses the cursor text "<tag><n>" (m NULL) or "<tag><n>_<m>" into *n and *m.  Returns
 * false when text has another form.
 */
bool tasks_cursor_parse(const char *text, char tag, unsigned long long *n, unsigned long long *m);

/* Sends the 400 invalid_parameter a cursor gets that no page of this list gave. */
enum MHD_Result tasks_reply_bad_cursor(struct mock_request *req);

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

/* Restores the settings and restarts the numbering of seeded tasks (POST /_reset). */
void tasks_reset(void);

/*
 * POST /_tasks/seed {"provider": NAME, "count": N}: makes N tasks of that personality that
 * no create made, with the client references "other-<n>", and answers {"provider", "count",
 * "tasks": [{"id", "client_ref"}, ...]}.
 */
enum MHD_Result tasks_handle_seed(struct mock_request *req);

#endif
