#ifndef IDEMGATE_CONFIG_H
#define IDEMGATE_CONFIG_H

#include "idemgate/backoff.h"
#include "idemgate/jpath.h"

#include <stddef.h>

/* The gateway's settings: one validated table (name, environment variable, type, default,
 * bounds), read once from a JSON file and the environment into an immutable struct that is
 * passed down. The environment wins over the file. Nothing here is global. */

enum cfg_mode { CFG_MODE_SYNC = 0 };

/* How an operation left `unknown` is resolved (DESIGN.md §3). */
enum cfg_reconcile {
    RECON_NONE = 0,            /* stay unknown until the window closes, then review */
    RECON_IDEMPOTENT_RESUBMIT, /* resend under the same provider idempotency key */
    RECON_GET_BY_CLIENT_ID,    /* look the task up by our client reference */
    RECON_LIST_MATCH,          /* list recent tasks and match our client reference */
};
const char *cfg_reconcile_name(enum cfg_reconcile r);

/* A route a client may call on a provider: POST /v1/providers/{provider}/{route}. Nothing that
 * is not declared is forwarded: the gateway is never an open proxy. */
struct cfg_route {
    char *route;  /* e.g. "images/generations" */
    char *method; /* outbound method, e.g. "POST" */
    char *path;   /* outbound path appended to base_url, e.g. "/v1/images/generations" */
};

struct cfg_provider {
    char *name;
    char *base_url;
    enum cfg_mode mode;
    char *auth_header; /* e.g. "Authorization"; NULL sends no credential */
    char *auth_prefix; /* e.g. "Bearer " */
    char *secret_env;  /* the environment variable holding the secret; the secret is never stored */
    long connect_timeout_ms;
    long total_timeout_ms;
    struct cfg_route *routes;
    size_t n_routes;

    /* Idempotency: the header the provider dedupes on, or NULL. */
    char *idem_header;
    /* Where the client reference (derived from the operation, never the client's key) goes:
     * a header, and/or a member of the JSON body ("metadata.client_ref"). */
    char *client_ref_header;
    char *client_ref_body_field;

    /* Retry: attempt limit, total deadline, full-jitter exponential backoff, a body hint. */
    int max_attempts;
    long deadline_ms;
    long backoff_base_ms;
    long backoff_cap_ms;
    struct bo_body_hint body_hint; /* body_hint.ok == 0: none */

    /* Reconciliation. */
    enum cfg_reconcile reconcile;
    long recovery_window_ms;   /* counts from the first send */
    long reconcile_interval_ms;
    char *lookup_path;         /* GET template with {client_ref}; 404 = proven absent */
    struct jpath *lookup_id;   /* remote id in the lookup's answer */
    char *list_path;           /* GET template with {since} and {until} (Unix seconds) */
    struct jpath *list_items;  /* each task in the list's answer */
    struct jpath *list_match;  /* the client reference in one task */
    struct jpath *list_id;     /* the remote id in one task */

    /* Results: requested and received outputs, usage. */
    struct jpath *outputs_requested; /* in the request body; NULL: not counted */
    int outputs_default;             /* when the request does not say */
    struct jpath *outputs_received;  /* an array in the response */
    struct jpath *usage;

    /* A cheap GET that proves the credential works again (clears a tripped breaker). */
    char *probe_path;
};

struct cfg {
    char *config_path;
    char *listen_host;
    int listen_port;
    char *database_url;
    char *instance_id; /* names this replica as a lease owner; defaults to host:pid */
    int http_threads;
    int dispatch_workers;
    long max_body_bytes;
    int max_json_depth;
    int lease_seconds;
    int reaper_interval_ms;
    int poll_interval_ms;
    int max_wait_seconds;
    int job_ttl_hours;
    int reconcile_workers;
    char *admin_token_sha256;
    int max_connections;
    char *log_level;
    struct cfg_provider *providers;
    size_t n_providers;
};

/* Loads path (NULL: defaults and environment only) and the environment into a new struct. On
 * failure returns NULL and writes a message naming the file and the field into err. */
struct cfg *cfg_load(const char *path, char *err, size_t errlen);
void cfg_free(struct cfg *c);

const struct cfg_provider *cfg_find_provider(const struct cfg *c, const char *name, size_t len);
const struct cfg_route *cfg_find_route(const struct cfg_provider *p, const char *route,
                                       size_t len);

/* Writes the settings table (name, environment variable, default, meaning) as Markdown. */
void cfg_print_reference(void);

#endif
