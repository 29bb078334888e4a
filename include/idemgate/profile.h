#ifndef IDEMGATE_PROFILE_H
#define IDEMGATE_PROFILE_H

#include "idemgate/archprof.h"
#include "idemgate/backoff.h"
#include "idemgate/jpath.h"
#include "idemgate/members.h"
#include "idemgate/pricing.h"

#include <cjson/cJSON.h>
#include <stddef.h>

/* Provider profiles: everything that differs between providers, as data (DESIGN.md §3). One
 * adapter engine reads them. A provider entry of the configuration may name a profile file
 * ("profile": "providers/replicate.json", relative to the configuration file); the entry's own
 * members override the profile's. Every field is validated at start; an error names the file
 * and the field; a member the loader does not read is refused with its path (members.h). */

enum cfg_mode { CFG_MODE_SYNC = 0, CFG_MODE_ASYNC_POLL = 1 };

/* The provider's task states, canonical (PROVIDERS.md). */
enum task_status { TS_QUEUED = 0, TS_RUNNING, TS_SUCCEEDED, TS_FAILED, TS_CANCELED, TS__COUNT };
const char *prof_status_name(enum task_status s);

struct status_entry {
    char *from; /* the provider's word */
    enum task_status to;
};

/* How an operation left `unknown` is resolved (DESIGN.md §3). */
enum cfg_reconcile {
    RECON_NONE = 0,            /* stay unknown until the window closes, then review */
    RECON_IDEMPOTENT_RESUBMIT, /* resend under the same provider idempotency key */
    RECON_GET_BY_CLIENT_ID,    /* look the task up by our client reference */
    RECON_LIST_MATCH,          /* list recent tasks and match our client reference */
};
const char *prof_reconcile_name(enum cfg_reconcile r);
/* The strategy named s, or -1. */
int prof_reconcile_parse(const char *s);

/* How a provider's webhook deliveries are verified (profile "webhook.verify"). */
enum webhook_verify {
    WHV_NONE = 0,          /* "none": unsigned; our client reference in it is not trusted */
    WHV_STANDARD_WEBHOOKS, /* "standard_webhooks" */
    WHV_HMAC_SHA256_HEX,   /* "hmac_sha256_hex" */
    WHV_ED25519,           /* "ed25519" */
};

/* A route a client may call on a provider: POST /v1/providers/{provider}/{route}. Nothing that
 * is not declared is forwarded: the gateway is never an open proxy. */
struct cfg_route {
    char *route;  /* e.g. "images/generations" */
    char *method; /* outbound method, e.g. "POST" */
    char *path;   /* outbound path appended to base_url, e.g. "/v1/images/generations" */
    int default_wait_s; /* the wait of a request without a Prefer header (an unmodified SDK's):
                           its provider's body when the job ends in time; 0: answer 202 at once */
    int multipart; /* it also takes multipart/form-data bodies (file uploads), forwarded as
                      they came (multipart.h) */
};

struct cfg_provider {
    char *name;
    char *base_url;
    enum cfg_mode mode;
    char *auth_header; /* e.g. "Authorization"; NULL sends no credential */
    char *auth_prefix; /* e.g. "Bearer " */
    /* Where the secret is (secrets.h): an environment variable's name (auth.secret_env) or
     * "file:" and a path (auth.secret_file). Each job keeps it; the secret is never stored. */
    char *credential;
    long connect_timeout_ms;
    long total_timeout_ms;
    /* A dispatcher's create may run this long (>= total_timeout_ms): its lease is renewed while
     * it runs (a long LLM stream). Every other call keeps total_timeout_ms, within its lease. */
    long create_timeout_ms;
    long keepalive_seconds; /* timeouts.keepalive_seconds: idle connections kept; 0: none */
    int max_inflight_calls; /* this provider's calls in flight per replica; 0: no own limit */
    size_t max_response_bytes; /* a longer answer is never a completed result */
    char *proxy;               /* the only proxy used (NULL: none, whatever the environment) */
    char *ca_file; /* tls.ca_file: the CA bundle for the provider's origin (NULL: the system's) */
    struct cfg_route *routes;
    size_t n_routes;

    /* The event stream format of its answers to a create whose body asks `"stream": true`
     * (enum sse_format; 0: none). A streamed answer is complete only with its terminal event. */
    int stream_format;
    /* Idempotency: the header the provider dedupes on, or NULL. */
    char *idem_header;
    /* Where the client reference (derived from the operation, never the client's key) goes:
     * a header, and/or a member of the JSON body ("metadata.client_ref"). */
    char *client_ref_header;
    char *client_ref_body_field;

    /* Retry: attempt limit, total deadline, full-jitter exponential backoff, a body hint. */
    int not_created[16]; /* statuses that prove no task was made (retry.not_created_statuses) */
    int n_not_created;
    int trip_statuses[8]; /* statuses that may trip the credential (auth.trip_statuses) */
    int n_trip_statuses;
    /* auth.trip_markers: body substrings that prove a trip status other than 401 is about the
     * credential or the account (e.g. "insufficient_quota"); without one it fails its job only. */
    char *trip_markers[8];
    int n_trip_markers;
    int max_attempts;
    long deadline_ms;
    long backoff_base_ms;
    long backoff_cap_ms;
    struct bo_body_hint body_hint; /* body_hint.ok == 0: none */

    /* Reconciliation. */
    enum cfg_reconcile reconcile;
    long recovery_window_ms;   /* counts from the first send; resends only inside it */
    long reconcile_interval_ms;
    long absent_grace_ms;      /* absence is concluded only this long after the last
                                * ambiguous send */
    char *lookup_path;         /* GET template with {client_ref} */
    struct jpath *lookup_id;   /* remote id in the lookup's answer */
    struct jpath *lookup_client_ref; /* our reference in a 2xx answer: the task is ours */
    struct jpath *lookup_absent;     /* in a 404's body: the provider's own "no such task" */
    char *lookup_absent_equals;      /* ...when the string there is this */
    char *list_path;           /* GET template with {since} and {until} (Unix seconds) */
    struct jpath *list_items;  /* each task in the list's answer: "<array>[*]" */
    struct jpath *list_array;  /* that array itself: a page without it proves nothing */
    int list_single_page;      /* the list is never paginated (no next_cursor) */
    struct jpath *list_match;  /* the client reference in one task */
    struct jpath *list_id;     /* the remote id in one task */
    struct jpath *list_next_cursor; /* the next page's cursor in a list answer, or NULL */
    char *list_cursor_param;   /* the query parameter that carries it */
    int list_max_pages;        /* more pages than this prove nothing */
    char *task_path;           /* GET template with {id}: one task (async: the poll path) */
    struct jpath *task_client_ref; /* the client reference in that task, or NULL */
    /* reconcile.task.resume: a cut stream the provider went on generating (OpenAI Responses with
     * "background": true) is resumed by a GET of the task path with this query, {after} being
     * the sequence number (at resume_sequence in each event's data) of the last whole event
     * recorded, when the request's resume_when is true. NULL: a cut stream is read back whole. */
    char *resume_query;
    char *resume_start_query; /* the same from the first event (resume.start_query), or NULL */
    struct jpath *resume_when, *resume_sequence;
    /* Where a found task's result (shaped as the create's answer) is inside a lookup's answer, a
     * list's item or a task read: reconcile.found_result; NULL: the whole answer. */
    struct jpath *found_result;

    /* Results: requested and received outputs, usage. */
    struct jpath *outputs_requested; /* in the request body; NULL: not counted */
    int outputs_default;             /* when the request does not say */
    struct jpath *outputs_received;  /* an array in the response */
    struct jpath *usage;

    /* A cheap GET that proves the credential works again (clears a tripped breaker). */
    char *probe_path;

    /* Where the profile came from. */
    char *profile_id;
    /* profile_id, '#' and a digest of what decides where the client reference goes, how the
     * reconciler's search reads it and where it looks (client_ref, reconcile.strategy, .list,
     * .lookup, base_url, headers): stored on every operation at its intake, and again by each
     * send (the profile it was sent under). The reconciler proves a job absent only under the
     * same digest (recon_same_reference): a search under another placement, match path or host
     * cannot see the task the create made, and its empty answer sent the create again. */
    char *profile_stamp;
    /* Extra request headers (e.g. a version header): name, value pairs, NULL-terminated. */
    char **headers;

    /* async_poll: the create's answer. */
    int accepted_statuses[8]; /* empty: any 2xx */
    int n_accepted_statuses;
    struct jpath *task_id;      /* the remote id in the create's answer */
    struct jpath *poll_url;     /* a poll URL the provider hands back, or NULL */

    /* Polling. */
    char *poll_method;        /* GET, or POST with poll_body */
    char *poll_path;          /* template: {id}, {client_ref} */
    char *poll_body;          /* JSON object text whose strings may hold {id}; or NULL */
    long poll_interval_ms, poll_max_interval_ms;
    char *poll_hint_header;   /* e.g. openai-poll-after-ms */
    long poll_deadline_ms;    /* from acceptance; then a read that does not end it: review */

    /* Status: a path and a map, or a done flag and an error, or the HTTP status. */
    struct jpath *status_path;
    struct status_entry *status_map;
    size_t n_status_map;
    struct jpath *done_path;
    struct jpath *error_present_path;
    int status_by_http; /* 200 → succeeded, 202 → running */

    /* Result. */
    char *result_fetch_path;       /* GET this template when done to get the outputs, or NULL */
    struct jpath *result_fetch_url; /* or the URL in the status answer */
    char *result_fetch_strip;       /* or the stored poll URL without this suffix (fal) */
    struct jpath *result_outputs;   /* each output (a URL string or an object) */
    struct jpath *result_output_url; /* within one output object, or NULL for a string */
    char *result_kind;              /* url, b64 or binary_endpoint */
    char *result_content_path;      /* binary_endpoint: template with {id} */
    struct jpath *result_expires_at;
    long result_url_ttl_s;
    struct jpath *result_error;
    struct jpath *result_filtered; /* how many outputs the provider withheld (Veo's filter) */

    /* Cancel. cancel_deletes: the provider's cancel deletes the task (Luma's DELETE): a read of
     * it answered 404 just after our cancel was accepted means it was cancelled. */
    char *cancel_method, *cancel_path;
    int cancel_deletes;

    /* Webhooks. */
    char *webhook_body_field;   /* where the callback URL goes in the create body */
    char *webhook_url_query;    /* or the query parameter of the create URL that carries it */
    enum webhook_verify webhook_verify;
    char *webhook_secret_env;
    char *webhook_signature_header;
    char *webhook_event_id_header; /* or, when NULL, webhook_event_id (a path in the body) */
    struct jpath *webhook_event_id;
    struct jpath *webhook_task_id;
    struct jpath *webhook_client_ref; /* our client reference in a delivery, or NULL */
    long webhook_window_hours;

    /* Prices (pricing.h): the estimate reserved at intake, the cost settled at completion. */
    struct price_table pricing;
    /* Output archival: the "archive" member (archprof.h); never NULL once loaded. */
    struct arch_profile *archive;
};

/* The member names of a provider entry of the configuration ("name", "profile" and every member a
 * profile may hold; members.h). prof_load_all refuses any other member, in an entry or in a
 * profile file, naming its path and the nearest valid name; config.c's table of the file's root
 * refers to it for "providers". */
extern const struct memb_table prof_entry_members;

/* Loads the providers array of the configuration file `file` (profiles resolved relative to
 * dir). Returns 0, or -1 with a message naming the file and the field in err; an unknown or
 * repeated member, in an entry or in a profile file, is refused before anything is read. */
int prof_load_all(const cJSON *arr, const char *file, const char *dir,
                  struct cfg_provider **out, size_t *n, char *err, size_t errlen);
void prof_free_all(struct cfg_provider *p, size_t n);

/* 1 when status is in the profile's list (not_created or trip_statuses). */
int prof_status_in(const int *list, int n, int status);

/* Maps the provider's status word; -1 when the map does not know it. */
int prof_map_status(const struct cfg_provider *p, const char *word);
/* The canonical task status (enum task_status) an answer shows, by the profile's rules: its
 * status path and map, its done flag and error, or its HTTP status. -1 when it cannot tell.
 * Pure. */
int prof_task_status(const struct cfg_provider *p, int http_status, const cJSON *doc);
/* How many outputs a finished task's answer says the provider withheld (result.filtered, e.g.
 * Veo's raiMediaFilteredCount: videos its safety filter kept back) when it returned none: a
 * whole number 1..1000000; else 0 — no such member or not such a number, an answer that holds
 * anything at result.outputs (an output there the profile cannot read is never taken for a
 * withheld one), or fewer withheld than the outputs the request asked for (`requested`, when
 * known: > 0). A task that withheld all it made has ended with nothing to deliver: completed
 * empty, not polled into review. Pure. */
long prof_outputs_withheld(const struct cfg_provider *p, const cJSON *doc, int requested);
/* 1 when the profile reads where a result's outputs are: outputs.received (the answer that
 * carries them) or, for an async profile that says where a request asks for a number of them
 * (outputs.requested), result.outputs (the finished task's). The outputs a request asks for
 * (outputs.requested, else outputs.default) are then counted at intake, and a result holding
 * none of them is never completed as empty. An async profile without outputs.requested (a task
 * whose provider may end it with nothing, as Veo's filtered videos) is not counted. Pure. */
int prof_counts_outputs(const struct cfg_provider *p);

#endif
