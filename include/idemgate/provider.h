#ifndef IDEMGATE_PROVIDER_H
#define IDEMGATE_PROVIDER_H

#include "idemgate/engine.h"
#include "idemgate/profile.h"
#include "idemgate/tmpl.h"
#include "idemgate/upstream.h"

#include <cjson/cJSON.h>
#include <stddef.h>

/* Talking to a provider the way its profile says: building its URLs, and one authenticated call
 * (dispatch, poll, reconcile, probe and cancel all go through prov_call). The secret is read from
 * the environment variable the operation names at the moment of the call, held only in a buffer
 * of its exact size, and zeroed once the call is made; no call leaves without it when the
 * operation names one (a 401 would read as the task's failure or trip the provider). Only the
 * profile's proxy is ever used, never the environment's. The response is capped at the profile's
 * max_response_bytes. */

struct prov_call {
    const char *method;
    const char *url;
    const char *credential;       /* where the secret is (secrets.h), or NULL / "" */
    const char *const *headers;   /* name, value, …, NULL (the profile's own are added) */
    const char *body;             /* or NULL */
    size_t body_len;
    int (*before_send)(void *arg); /* see up_request */
    void *before_send_arg;
    void (*on_stream)(void *arg, const char *p, size_t n); /* see up_request */
    void *on_stream_arg;
    long total_timeout_ms; /* > 0: a shorter limit than the profile's for this call */
    /* A dispatcher's create whose lease is renewed while it runs: the profile's
     * create_timeout_ms is its limit (total_timeout_ms above then ignored). */
    int lease_kept;
    int stream_kept;       /* see up_request */
};

/* Performs the call. Fills *res as up_call does (free with up_response_fini). Returns 0 when a
 * response with a status line arrived, -1 otherwise; -1 with res->aborted_before_send and
 * res->error "the provider's credential is not set …" when the secret is missing (nothing
 * sent). */
__attribute__((warn_unused_result)) int prov_call(const struct cfg_provider *p,
                                                  const struct prov_call *c,
                                                  struct up_response *res);

/* 1 when a secret can be a header's value as it is: no control byte (a line end at its end — a
 * secret made from a file — would end the header block early and smuggle the rest as another
 * request); 0 otherwise. Pure. */
int prov_secret_ok(const char *secret);
/* The same call as a transfer for the call engine (engine.h): built, not sent. Returns 0 with the
 * transfer in *out, or -1 with *res filled as prov_call fills it when nothing can be sent (a
 * missing credential, out of memory). c's body and before_send_arg must outlive the transfer. */
__attribute__((warn_unused_result)) int prov_xfer_new(const struct cfg_provider *p,
                                                      const struct prov_call *c,
                                                      struct up_xfer **out,
                                                      struct up_response *res);

/* Submits the call to the call engine on a slot taken for slot (engine.h): done(arg, res) runs
 * once, on an engine thread when it ended; at once on this thread, the slot given back, when it
 * cannot be made (c->url NULL, a missing credential): res then holds why. */
void prov_submit(struct eng *e, int slot, const struct cfg_provider *p, const struct prov_call *c,
                 eng_done_fn done, void *arg);

/* base_url + tmpl expanded with path-segment escaping of every value. A new string, or NULL
 * (logged, naming the provider and what) when a value cannot be placed. */
char *prov_url(const struct cfg_provider *p, const char *tmpl, tmpl_lookup_fn lookup, void *arg,
               const char *what);

/* Reads one task by its id: GET of reconcile.task.path, or of the poll path of an async provider
 * ({id} = remote_id, {client_ref} = client_ref), with the credential named. Returns 0 when a
 * whole 2xx answer is in *res, -1 otherwise (no way to read, no answer, another status, or an
 * answer over the cap). *res is always filled: release it with up_response_fini. */
int prov_read_task(const struct cfg_provider *p, const char *credential, const char *remote_id,
                   const char *client_ref, struct up_response *res);
/* The URL prov_read_task reads (a new string), or NULL when the profile has no way to read a
 * task. */
char *prov_task_url(const struct cfg_provider *p, const char *remote_id, const char *client_ref);
/* The URL resuming task remote_id's event stream after its event number `after`: the task's
 * URL with reconcile.task.resume.query added (after < 0: resume.start_query, from the first
 * event). NULL when the profile has none (or out of memory). */
char *prov_resume_url(const struct cfg_provider *p, const char *remote_id, long long after);
/* 1 when res is a whole 2xx answer (what prov_read_task returns 0 for). */
int prov_task_answered(const struct up_response *res);

/* The status a fetched result shows: TS_SUCCEEDED, TS_FAILED for an error the result carries
 * (a 4xx whose body holds the profile's result.error: fal's 422 with its `detail`), or -1 when
 * there is no readable answer — read again later. A task whose status said it ended is paid
 * whatever its fetch answers: a refusal that says nothing of the task (401/403 a rotated key,
 * 404 not yet visible, 408/409/425/429 later) never makes it failed. */
int prov_fetched_status(const struct cfg_provider *p, const struct up_response *res);

/* 1 when a task read by prov_read_task carries client_ref where the profile says
 * (reconcile.task.client_ref); 0 when it does not, or the profile does not say where. */
int prov_task_is(const struct cfg_provider *p, const struct up_response *res,
                 const char *client_ref);

/* s percent-encoded as a query value (RFC 3986 unreserved kept), in a new string; NULL when out
 * of memory. */
char *prov_query_escape(const char *s);

/* 1 when url is on the same scheme, host and port as base: a URL a provider hands back is only
 * followed when it is (no server-side request forgery). */
int prov_same_origin(const char *url, const char *base);

/* Parses a provider's JSON answer for reading ids: every integer token is turned into a string of
 * its exact digits first, so a numeric id above 2^53 is not rounded by cJSON's doubles. Other
 * numbers stay numbers. Returns a tree (cJSON_Delete it) or NULL when body is not JSON. */
cJSON *prov_id_doc(const char *body, size_t len);

/* The id at path in a tree from prov_id_doc: a non-empty string of at most 255 bytes (integer
 * ids come as their digits), else NULL. Points into doc. */
const char *prov_read_id(const struct jpath *path, const cJSON *doc);

#endif
