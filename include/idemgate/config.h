#ifndef IDEMGATE_CONFIG_H
#define IDEMGATE_CONFIG_H

#include "idemgate/profile.h"

#include <stddef.h>

/* The gateway's settings: one validated table (name, environment variable, type, default,
 * bounds), read once from a JSON file and the environment into an immutable struct that is
 * passed down. The environment wins over the file. Nothing here is global. */

struct cfg {
    char *config_path;
    char *listen_host;
    int listen_port;
    /* The metrics listener (metrics_listener.h): "" when there is none. */
    char *metrics_listen_host;
    int metrics_listen_port;
    char *metrics_token_sha256; /* "" or the hex SHA-256 of the token /metrics requires */
    char *database_url;
    char *instance_id; /* names this replica as a lease owner; defaults to host:pid */
    int http_threads;
    int dispatch_workers;
    int max_inflight_calls; /* provider calls in flight in this replica (engine.h) */
    int call_threads;       /* threads driving them */
    int intake_writers;
    int db_workers;
    int tenant_requests_per_second, tenant_burst, tenant_wait_connections;
    int intake_batch_max;
    long max_body_bytes;
    long max_upload_bytes;
    long max_buffered_body_bytes;
    int max_json_depth;
    int lease_seconds;
    int reaper_interval_ms;
    int poll_interval_ms;
    int wait_poll_ms;
    int max_wait_seconds;
    int job_ttl_hours;
    int janitor_interval_ms; /* retention sweeps (reaper.c, retention.h) */
    int janitor_batch;
    int reconcile_workers;
    int reconcile_max_inflight;
    int archive_max_inflight;
    int archive_s3_reads_max; /* bucket reads at once (archread.c) */
    int poll_workers;
    int job_cache_entries;
    int job_cache_ttl_ms;
    long job_cache_bytes;
    long stream_memory_bytes;
    char *stream_spool_dir;
    char *public_url;
    char *admin_token_sha256;
    int max_connections;
    int max_connections_per_address; /* 0 in the file: a quarter of max_connections */
    int request_deadline_seconds;
    char *log_level;
    /* Output archival (archive.c). */
    char *archive_backend, *archive_dir;
    char *archive_s3_endpoint, *archive_s3_bucket, *archive_s3_region;
    char *archive_s3_access_key_env, *archive_s3_secret_key_env;
    int archive_workers;
    struct cfg_provider *providers;
    size_t n_providers;
    /* Upload parts longer than this go to the archive store (uplstore.h); 0: none. */
    long upload_part_inline_bytes;
};

/* Loads path (NULL: defaults and environment only) and the environment into a new struct. On
 * failure returns NULL and writes a message naming the file and the field into err. */
struct cfg *cfg_load(const char *path, char *err, size_t errlen);
void cfg_free(struct cfg *c);

const struct cfg_provider *cfg_find_provider(const struct cfg *c, const char *name, size_t len);
/* Why target ("{provider}/{route}") is not forwarded, for its 404: the provider is not
 * configured (the configured ones listed), or it has no such route (its routes listed); into out,
 * cut to fit. */
void cfg_explain_unknown_target(const struct cfg *c, const char *target, char *out, size_t len);
const struct cfg_route *cfg_find_route(const struct cfg_provider *p, const char *route,
                                       size_t len);

/* Writes the settings table (name, environment variable, default, meaning) as Markdown. */
void cfg_print_reference(void);

/* The text[] literal of the configured providers that skip(i, arg) does not exclude (skip NULL:
 * all), into buf (len >= 3); returns how many it names. Provider names are [a-z0-9_-]+: nothing
 * needs quoting. A name that would not fit is left out. */
int cfg_providers_literal(const struct cfg *cfg, int (*skip)(int i, void *arg), void *arg,
                          char *buf, size_t len);

#endif
