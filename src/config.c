#include "idemgate/config.h"

#include "idemgate/members.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum cfg_type { T_STR, T_INT, T_LONG };

/* The settings table, alphabetical. The file key is `name`; the environment variable wins. */
struct cfg_setting {
    const char *name;
    const char *env;
    enum cfg_type type;
    size_t offset;
    const char *def;
    long min, max;
    const char *doc;
};

#define OFF(f) offsetof(struct cfg, f)
static const struct cfg_setting settings[] = {
    {"admin_token_sha256", "IDEMGATE_ADMIN_TOKEN_SHA256", T_STR, OFF(admin_token_sha256), "", 0,
     0, "hex SHA-256 of the admin bearer token (empty: admin API off)"},
    {"archive_backend", "IDEMGATE_ARCHIVE_BACKEND", T_STR, OFF(archive_backend), "local", 0, 0,
     "where outputs are archived: local (archive_dir) or s3 (an S3-compatible bucket; a PUT "
     "refused in passing — 5xx, 429, no answer — is tried again at once, three tries in all "
     "while each answers within 10 s, with the copy's bytes in hand)"},
    {"archive_dir", "IDEMGATE_ARCHIVE_DIR", T_STR, OFF(archive_dir), "/var/lib/idemgate/archive",
     0, 0, "local archive folder (objects by SHA-256; with s3, the spool of copies in progress)"},
    {"archive_s3_access_key_env", "IDEMGATE_ARCHIVE_S3_ACCESS_KEY_ENV", T_STR,
     OFF(archive_s3_access_key_env), "AWS_ACCESS_KEY_ID", 0, 0,
     "environment variable holding the bucket's access key id"},
    {"archive_s3_bucket", "IDEMGATE_ARCHIVE_S3_BUCKET", T_STR, OFF(archive_s3_bucket), "", 0, 0,
     "bucket name (path-style URLs: endpoint/bucket/key)"},
    {"archive_s3_endpoint", "IDEMGATE_ARCHIVE_S3_ENDPOINT", T_STR, OFF(archive_s3_endpoint), "",
     0, 0, "S3-compatible endpoint, e.g. https://s3.eu-west-1.amazonaws.com"},
    {"archive_s3_region", "IDEMGATE_ARCHIVE_S3_REGION", T_STR, OFF(archive_s3_region),
     "us-east-1", 0, 0, "SigV4 signing region"},
    {"archive_s3_secret_key_env", "IDEMGATE_ARCHIVE_S3_SECRET_KEY_ENV", T_STR,
     OFF(archive_s3_secret_key_env), "AWS_SECRET_ACCESS_KEY", 0, 0,
     "environment variable holding the bucket's secret key"},
    {"archive_s3_reads_max", "IDEMGATE_ARCHIVE_S3_READS_MAX", T_INT, OFF(archive_s3_reads_max),
     "2", 1, 256,
     "outputs read from the bucket at once in this replica to answer GET …/outputs/{n} (each read "
     "holds one of the db_workers threads while the whole object comes and is checked against "
     "its SHA-256); with more than one of db_workers, at most db_workers - 1 of them, so that "
     "one is always left for every other read and action; another read is answered 503 "
     "archive-busy with Retry-After"},
    {"archive_max_inflight", "IDEMGATE_ARCHIVE_MAX_INFLIGHT", T_INT, OFF(archive_max_inflight),
     "16", 1, 10000,
     "output copies in flight at once in this replica (on the call engine); each holds a "
     "temporary file of up to its profile's archive.max_bytes"},
    {"archive_workers", "IDEMGATE_ARCHIVE_WORKERS", T_INT, OFF(archive_workers), "1", 0, 64,
     "archive threads in this replica (plan, claim, decode base64, publish and write copies; 0: "
     "none here)"},
    {"call_threads", "IDEMGATE_CALL_THREADS", T_INT, OFF(call_threads), "2", 1, 64,
     "threads driving the provider calls in flight (libcurl multi on epoll; each drives "
     "thousands)"},
    {"database_url", "DATABASE_URL", T_STR, OFF(database_url), "postgresql:///idemgate", 0, 0,
     "libpq connection string of the PostgreSQL database"},
    {"db_workers", "IDEMGATE_DB_WORKERS", T_INT, OFF(db_workers), "4", 1, 256,
     "threads (each with one database connection) that answer the API's reads and actions; "
     "server threads never wait on the database. Their queue is served one caller (a tenant, "
     "the operator, a provider's webhooks, the probes; unknown tokens together) at a time in "
     "turn"},
    {"dispatch_workers", "IDEMGATE_DISPATCH_WORKERS", T_INT, OFF(dispatch_workers), "2", 0, 256,
     "dispatcher threads in this replica, each with one database connection: they claim due "
     "creates and write their results (one at a time, the others helping when a whole batch "
     "waits or it is held up), and never wait for a provider (0: this replica only takes "
     "requests)"},
    {"http_threads", "IDEMGATE_HTTP_THREADS", T_INT, OFF(http_threads), "4", 1, 256,
     "HTTP server threads (they never wait on the database)"},
    {"instance_id", "IDEMGATE_INSTANCE_ID", T_STR, OFF(instance_id), "", 0, 0,
     "lease owner name of this replica (default host:pid)"},
    {"intake_batch_max", "IDEMGATE_INTAKE_BATCH_MAX", T_INT, OFF(intake_batch_max), "64", 1, 4096,
     "most intents recorded by one group commit"},
    {"intake_writers", "IDEMGATE_INTAKE_WRITERS", T_INT, OFF(intake_writers), "2", 1, 64,
     "threads (each with one database connection) that record intents in group commits: one "
     "takes what waits, the others help when a whole batch waits or it is held up 20 ms"},
    {"janitor_batch", "IDEMGATE_JANITOR_BATCH", T_INT, OFF(janitor_batch), "500", 1, 100000,
     "most rows of each kind (expired jobs, webhook records, parked hints) one janitor statement "
     "deletes"},
    {"janitor_interval_ms", "IDEMGATE_JANITOR_INTERVAL_MS", T_INT, OFF(janitor_interval_ms),
     "60000", 0, 86400000,
     "how often expired jobs (after job_ttl_hours; each key's tombstone answers a retry under "
     "it for 30 days), their attempts, webhook records and parked hints are deleted (0: never, "
     "in this replica)"},
    {"job_cache_bytes", "IDEMGATE_JOB_CACHE_BYTES", T_LONG, OFF(job_cache_bytes), "67108864", 0,
     64L * 1024 * 1024 * 1024,
     "most bytes the job cache holds (its jobs' documents and answers; 0: no byte bound): an "
     "answer larger than a sixteenth of it is not cached, its replays read the database"},
    {"job_cache_entries", "IDEMGATE_JOB_CACHE_ENTRIES", T_INT, OFF(job_cache_entries), "8192", 0,
     10000000, "terminal jobs kept in memory for replays and reads (0: no cache)"},
    {"job_cache_ttl_ms", "IDEMGATE_JOB_CACHE_TTL_MS", T_INT, OFF(job_cache_ttl_ms), "5000", 1,
     3600000, "how long a cached terminal job may answer (only to a token the tenant directory "
              "holds live); a "
              "completed job whose outputs are still being archived answers reads by id from "
              "memory for 250 ms at most, so that its archive state is never older than that"},
    {"job_ttl_hours", "IDEMGATE_JOB_TTL_HOURS", T_INT, OFF(job_ttl_hours), "168", 1, 87600,
     "how long a job and its key are kept, from its intake and again from its end"},
    {"lease_seconds", "IDEMGATE_LEASE_SECONDS", T_INT, OFF(lease_seconds), "180", 2, 3600,
     "lease of a dispatch; must exceed every provider's total_ms (a longer create renews it)"},
    {"listen", "IDEMGATE_LISTEN", T_STR, OFF(listen_host), "127.0.0.1:8080", 0, 0,
     "HOST:PORT the HTTP API listens on (alone: a second process given an address in use "
     "exits with `http_start_failed`)"},
    {"log_level", "IDEMGATE_LOG_LEVEL", T_STR, OFF(log_level), "info", 0, 0,
     "debug, info, warn or error"},
    {"max_body_bytes", "IDEMGATE_MAX_BODY_BYTES", T_LONG, OFF(max_body_bytes), "1048576", 2,
     64L * 1024 * 1024, "largest request body accepted (413 above)"},
    {"max_buffered_body_bytes", "IDEMGATE_MAX_BUFFERED_BODY_BYTES", T_LONG,
     OFF(max_buffered_body_bytes), "536870912", 1024L * 1024, 64L * 1024 * 1024 * 1024,
     "request bodies held in memory at once, all connections together (while they arrive and "
     "until their request ends, or its `Prefer: wait` begins: a waiting request holds no "
     "body); a body that would pass it is dropped as it comes and answered "
     "503 with Retry-After, whatever its token: clients cannot exhaust memory with bodies; "
     "the bodies of requests without a live tenant's or the operator's token (none, an unknown "
     "one, webhooks) hold at most half of it together, so they cannot take it from the tenants; "
     "one tenant's at most a quarter of it (or one body of the largest cap, when that is more), "
     "so one tenant cannot take it from the others; its last body of the largest cap (a "
     "quarter at most) is kept for the first body of a tenant holding none, so tenants at their "
     "shares cannot take it from the others together. At least twice max_upload_bytes and "
     "max_body_bytes (an allocation doubles as a body grows)"},
    {"max_connections", "IDEMGATE_MAX_CONNECTIONS", T_INT, OFF(max_connections), "4096", 16,
     100000, "concurrent client connections, suspended ones included; 8 more are kept for "
             "`/healthz` alone (each closed after its answer), so health is answered when full"},
    {"max_connections_per_address", "IDEMGATE_MAX_CONNECTIONS_PER_ADDRESS", T_INT,
     OFF(max_connections_per_address), "0", 0, 100000,
     "concurrent client connections from one IP address; more are closed at once (0: a quarter "
     "of max_connections; behind a proxy that connects from one address, raise it)"},
    {"max_inflight_calls", "IDEMGATE_MAX_INFLIGHT_CALLS", T_INT, OFF(max_inflight_calls),
     "10000", 1, 1000000,
     "provider creates in flight at once in this replica, on call_threads threads and no "
     "database connection (a provider's own max_inflight_calls may lower it for that provider)"},
    {"max_json_depth", "IDEMGATE_MAX_JSON_DEPTH", T_INT, OFF(max_json_depth), "64", 1, 1024,
     "deepest nesting of arrays and objects accepted in a body"},
    {"max_upload_bytes", "IDEMGATE_MAX_UPLOAD_BYTES", T_LONG, OFF(max_upload_bytes), "26214400",
     2, 512L * 1024 * 1024,
     "largest multipart/form-data body (a file upload, on a route that takes one) accepted (413 "
     "above); it is kept in memory while it arrives and stored for a resend (its large parts "
     "in the archive store: upload_part_inline_bytes)"},
    {"max_wait_seconds", "IDEMGATE_MAX_WAIT_SECONDS", T_INT, OFF(max_wait_seconds), "60", 0, 3600,
     "cap on Prefer: wait=N"},
    {"metrics_listen", "IDEMGATE_METRICS_LISTEN", T_STR, OFF(metrics_listen_host), "", 0, 0,
     "HOST:PORT of a second listener that serves only /metrics, /healthz and /readyz (empty: "
     "none; /metrics is then served by `listen`); once set, `listen` answers /metrics 404 "
     "except to the admin token"},
    {"metrics_token_sha256", "IDEMGATE_METRICS_TOKEN_SHA256", T_STR, OFF(metrics_token_sha256),
     "", 0, 0,
     "hex SHA-256 of the bearer token /metrics requires (the admin token is also accepted; "
     "empty: no token)"},
    {"poll_interval_ms", "IDEMGATE_POLL_INTERVAL_MS", T_INT, OFF(poll_interval_ms), "1000", 10,
     60000, "dispatcher fallback poll when no wake-up arrives"},
    {"poll_workers", "IDEMGATE_POLL_WORKERS", T_INT, OFF(poll_workers), "1", 0, 64,
     "poller threads in this replica (status reads of accepted async jobs, cancels)"},
    {"public_url", "IDEMGATE_PUBLIC_URL", T_STR, OFF(public_url), "", 0, 0,
     "URL providers can reach this gateway at, for webhooks (empty: no webhooks registered)"},
    {"reconcile_max_inflight", "IDEMGATE_RECONCILE_MAX_INFLIGHT", T_INT,
     OFF(reconcile_max_inflight), "64", 1, 100000,
     "unknown operations of one provider reconciled at once in this replica (their lookups, "
     "list searches and resends in flight on the call engine): a provider's search endpoints "
     "are not asked more, and one provider's slow searches never hold up another's"},
    {"reconcile_workers", "IDEMGATE_RECONCILE_WORKERS", T_INT, OFF(reconcile_workers), "1", 0, 64,
     "reconciler threads in this replica (claim unknown operations and write what their calls "
     "proved)"},
    {"reaper_interval_ms", "IDEMGATE_REAPER_INTERVAL_MS", T_INT, OFF(reaper_interval_ms), "1000",
     0, 600000, "how often expired leases are turned into unknown (0: never, in this replica)"},
    {"request_deadline_seconds", "IDEMGATE_REQUEST_DEADLINE_SECONDS", T_INT,
     OFF(request_deadline_seconds), "30", 1, 3600,
     "a request's headers and body must have arrived this long after its connection was opened "
     "(or its previous answer sent), however steadily they trickle; otherwise the connection is "
     "closed"},
    {"stream_memory_bytes", "IDEMGATE_STREAM_MEMORY_BYTES", T_LONG, OFF(stream_memory_bytes),
     "262144", 0, 1024L * 1024 * 1024,
     "bytes of a live stream (an LLM's events, relayed to its clients and recorded) kept in "
     "memory; a longer one is moved to an unlinked file in stream_spool_dir, memory keeping only "
     "the event being received (0: all in memory)"},
    {"stream_spool_dir", "IDEMGATE_STREAM_SPOOL_DIR", T_STR, OFF(stream_spool_dir), "", 0, 0,
     "the folder long live streams are spooled to (\"\": archive_dir's tmp folder, the spool "
     "every deployment already gives the archive; created if missing): files nobody else sees, "
     "gone with the stream or the process; a folder that cannot take them keeps streams in "
     "memory, said once in the log"},
    {"tenant_burst", "IDEMGATE_TENANT_BURST", T_INT, OFF(tenant_burst), "0", 0, 1000000,
     "default requests a tenant may send at once above its rate (0: one second's worth)"},
    {"tenant_requests_per_second", "IDEMGATE_TENANT_REQUESTS_PER_SECOND", T_INT,
     OFF(tenant_requests_per_second), "0", 0, 1000000,
     "default new requests per second per tenant and replica (0: no limit); `tenant limits` "
     "sets a tenant's own"},
    {"tenant_wait_connections", "IDEMGATE_TENANT_WAIT_CONNECTIONS", T_INT,
     OFF(tenant_wait_connections), "0", 0, 1000000,
     "default `Prefer: wait` connections a tenant may hold per replica (0: no limit)"},
    {"upload_part_inline_bytes", "IDEMGATE_UPLOAD_PART_INLINE_BYTES", T_LONG,
     OFF(upload_part_inline_bytes), "65536", 0, 512L * 1024 * 1024,
     "an uploaded file (a multipart/form-data part with a filename) whose content is longer is "
     "kept in the archive store (archive_backend), by its SHA-256, and only referred to from its "
     "job's row; shorter files and every text field stay in the row (0: every upload whole in "
     "the row)"},
    {"wait_poll_ms", "IDEMGATE_WAIT_POLL_MS", T_INT, OFF(wait_poll_ms), "1000", 10, 600000,
     "how often the jobs of Prefer: wait clients are read again (bounds the delay a lost wake-up "
     "signal from another replica can cause)"},
};
#undef OFF
#define N_SETTINGS (sizeof(settings) / sizeof(settings[0]))

static void errf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Stores the text value v into the field of s, checking type and bounds. */
static int set_value(struct cfg *c, const struct cfg_setting *s, const char *v, const char *where,
                     char *err, size_t errlen)
{
    char *field = (char *)c + s->offset;
    if (s->type == T_STR) {
        char *dup = strdup(v);
        if (!dup)
            return -1;
        free(*(char **)field);
        *(char **)field = dup;
        return 0;
    }
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end != '\0' || n < s->min || n > s->max) {
        errf(err, errlen, "%s: %s must be an integer in [%ld, %ld], got \"%s\"", where, s->name,
             s->min, s->max, v);
        return -1;
    }
    if (s->type == T_INT)
        *(int *)field = (int)n;
    else
        *(long *)field = n;
    return 0;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0)
            break;
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}
/* Cuts "HOST:PORT" in *host at its last colon into *host and *port. */
static int split_host_port(const char *name, char *host, int *port, char *err, size_t errlen)
{
    char *colon = strrchr(host, ':');
    char *end;
    long p = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || *end != '\0' || p < 0 || p > 65535) {
        errf(err, errlen, "%s must be HOST:PORT, got \"%s\"", name, host);
        return -1;
    }
    *colon = '\0';
    *port = (int)p;
    return 0;
}

/* The API's address, and the metrics listener's when there is one (never the same). */
static int split_listen(struct cfg *c, char *err, size_t errlen)
{
    if (split_host_port("listen", c->listen_host, &c->listen_port, err, errlen) < 0)
        return -1;
    if (!*c->metrics_listen_host)
        return 0;
    if (split_host_port("metrics_listen", c->metrics_listen_host, &c->metrics_listen_port, err,
                        errlen) < 0)
        return -1;
    if (c->metrics_listen_port && c->metrics_listen_port == c->listen_port &&
        strcmp(c->metrics_listen_host, c->listen_host) == 0) {
        errf(err, errlen, "metrics_listen must differ from listen");
        return -1;
    }
    return 0;
}

/* A token's SHA-256 is empty or 64 lowercase hex digits. */
static int check_sha256(const char *name, const char *v, char *err, size_t errlen)
{
    if (!*v || (strlen(v) == 64 && strspn(v, "0123456789abcdef") == 64))
        return 0;
    errf(err, errlen, "%s must be 64 lowercase hex digits (the SHA-256 of the token)", name);
    return -1;
}

/* Refuses a member of the file's root that is neither a setting of the table above nor
 * "providers" (whose entries prof_load_all checks), naming the nearest setting. */
static int check_root_members(const cJSON *root, const char *path, char *err, size_t errlen)
{
    struct memb names[N_SETTINGS + 1];
    for (size_t i = 0; i < N_SETTINGS; i++)
        names[i] = (struct memb){settings[i].name, MEMB_VALUE, NULL};
    names[N_SETTINGS] = (struct memb){"providers", MEMB_VALUE, NULL};
    const struct memb_table table = {names, N_SETTINGS + 1, NULL};
    struct memb_problem p;
    if (memb_check(root, &table, "", &p) == 0)
        return 0;
    char msg[400];
    memb_message(&p, msg, sizeof(msg));
    errf(err, errlen, "%s: %s", path, msg);
    return -1;
}

/* The file's members into c: settings by name, then the providers (profiles resolved relative to
 * the file's folder). */
static int load_file(struct cfg *c, const cJSON *root, const char *path, char *err, size_t errlen)
{
    if (check_root_members(root, path, err, errlen) < 0)
        return -1;
    const cJSON *item;
    cJSON_ArrayForEach(item, root)
    {
        if (strcmp(item->string, "providers") == 0)
            continue;
        const struct cfg_setting *s = NULL;
        for (size_t i = 0; i < N_SETTINGS; i++)
            if (strcmp(settings[i].name, item->string) == 0)
                s = &settings[i];
        if (!s) /* check_root_members refused it */
            return -1;
        char num[64];
        const char *v = NULL;
        if (cJSON_IsString(item))
            v = item->valuestring;
        else if (cJSON_IsNumber(item) && s->type != T_STR) {
            snprintf(num, sizeof(num), "%.0f", item->valuedouble);
            v = num;
        }
        if (!v) {
            errf(err, errlen, "%s: %s has the wrong type", path, s->name);
            return -1;
        }
        if (set_value(c, s, v, path, err, errlen) < 0)
            return -1;
    }
    const cJSON *provs = cJSON_GetObjectItemCaseSensitive(root, "providers");
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof(dir), ".");
    return provs ? prof_load_all(provs, path, dir, &c->providers, &c->n_providers, err, errlen)
                 : 0;
}

/* Checks that need every setting: listen address, instance id, log level, leases vs timeouts. */
static int finish_settings(struct cfg *c, const char *file, char *err, size_t errlen)
{
    if (split_listen(c, err, errlen) < 0 ||
        check_sha256("metrics_token_sha256", c->metrics_token_sha256, err, errlen) < 0 ||
        check_sha256("admin_token_sha256", c->admin_token_sha256, err, errlen) < 0)
        return -1;
    if (!*c->instance_id) {
        char host[128] = "host", id[200];
        gethostname(host, sizeof(host) - 1);
        snprintf(id, sizeof(id), "%s:%ld", host, (long)getpid());
        free(c->instance_id);
        c->instance_id = strdup(id);
    }
    if (strcmp(c->log_level, "debug") && strcmp(c->log_level, "info") &&
        strcmp(c->log_level, "warn") && strcmp(c->log_level, "error")) {
        errf(err, errlen, "%s: log_level must be debug, info, warn or error", file);
        return -1;
    }
    if (strcmp(c->archive_backend, "local") && strcmp(c->archive_backend, "s3")) {
        errf(err, errlen, "%s: archive_backend must be local or s3", file);
        return -1;
    }
    if (!strcmp(c->archive_backend, "s3") && (!*c->archive_s3_endpoint || !*c->archive_s3_bucket)) {
        errf(err, errlen, "%s: archive_backend s3 needs archive_s3_endpoint and archive_s3_bucket",
             file);
        return -1;
    }
    /* A body's allocation doubles as it grows: one whole body of either cap must fit. */
    if (c->max_buffered_body_bytes < 2 * c->max_upload_bytes ||
        c->max_buffered_body_bytes < 2 * c->max_body_bytes) {
        errf(err, errlen,
             "%s: max_buffered_body_bytes (%ld) must be at least twice max_upload_bytes (%ld) "
             "and max_body_bytes (%ld)",
             file, c->max_buffered_body_bytes, c->max_upload_bytes, c->max_body_bytes);
        return -1;
    }
    for (size_t i = 0; i < c->n_providers; i++) {
        /* An S3 object is stored by one PUT (blobstore.c), which S3 takes up to 5 GiB: an output
         * allowed past that would be refused on every copy until its URL expired. */
        const struct arch_profile *ap = c->providers[i].archive;
        if (!strcmp(c->archive_backend, "s3") && ap && ap->max_bytes > 5LL * 1024 * 1024 * 1024) {
            errf(err, errlen,
                 "%s: providers.%s.archive.max_bytes (%lld) is over 5 GiB, the most "
                 "archive_backend s3 stores in one object",
                 file, c->providers[i].name, ap->max_bytes);
            return -1;
        }
        /* A lease shorter than a call would let the reaper declare a live call unknown. */
        if (c->providers[i].total_timeout_ms + 2000 > (long)c->lease_seconds * 1000) {
            errf(err, errlen,
                 "%s: lease_seconds (%d) must exceed providers.%s.timeouts.total_ms (%ld) by 2 s",
                 file, c->lease_seconds, c->providers[i].name, c->providers[i].total_timeout_ms);
            return -1;
        }
    }
    return 0;
}

struct cfg *cfg_load(const char *path, char *err, size_t errlen)
{
    struct cfg *c = calloc(1, sizeof(*c));
    cJSON *root = NULL;
    char *text = NULL;
    const char *file = path ? path : "(defaults)";
    if (!c)
        goto failed;
    snprintf(err, errlen, "out of memory");
    for (size_t i = 0; i < N_SETTINGS; i++) {
        if (set_value(c, &settings[i], settings[i].def, "default", err, errlen) < 0)
            goto failed;
    }
    if (path) {
        size_t len = 0;
        c->config_path = strdup(path);
        text = read_file(path, &len);
        if (!text) {
            errf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
            goto failed;
        }
        const char *endp = NULL;
        root = cJSON_ParseWithLengthOpts(text, len, &endp, 0);
        if (!root || !cJSON_IsObject(root)) {
            errf(err, errlen, "%s: not a JSON object (near byte %ld)", path,
                 endp ? (long)(endp - text) : 0L);
            goto failed;
        }
        if (load_file(c, root, path, err, errlen) < 0)
            goto failed;
    }
    /* The environment wins over the file. */
    for (size_t i = 0; i < N_SETTINGS; i++) {
        const char *v = getenv(settings[i].env);
        char where[128];
        snprintf(where, sizeof(where), "environment %s", settings[i].env);
        if (v && *v && set_value(c, &settings[i], v, where, err, errlen) < 0)
            goto failed;
    }
    if (finish_settings(c, file, err, errlen) < 0)
        goto failed;
    free(text);
    cJSON_Delete(root);
    return c;
failed:
    free(text);
    cJSON_Delete(root);
    cfg_free(c);
    return NULL;
}

void cfg_free(struct cfg *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < N_SETTINGS; i++)
        if (settings[i].type == T_STR)
            free(*(char **)((char *)c + settings[i].offset));
    prof_free_all(c->providers, c->n_providers);
    free(c->config_path);
    free(c);
}

const struct cfg_provider *cfg_find_provider(const struct cfg *c, const char *name, size_t len)
{
    for (size_t i = 0; i < c->n_providers; i++)
        if (strlen(c->providers[i].name) == len && memcmp(c->providers[i].name, name, len) == 0)
            return &c->providers[i];
    return NULL;
}

const struct cfg_route *cfg_find_route(const struct cfg_provider *p, const char *route, size_t len)
{
    for (size_t i = 0; i < p->n_routes; i++)
        if (strlen(p->routes[i].route) == len && memcmp(p->routes[i].route, route, len) == 0)
            return &p->routes[i];
    return NULL;
}

/* Appends s to out (len bytes, pos used), cut to fit; returns the new pos. */
static size_t append(char *out, size_t len, size_t pos, const char *s)
{
    if (pos + 1 >= len)
        return pos;
    int n = snprintf(out + pos, len - pos, "%s", s);
    return n < 0 ? pos : pos + (size_t)n >= len ? len - 1 : pos + (size_t)n;
}

void cfg_explain_unknown_target(const struct cfg *c, const char *target, char *out, size_t len)
{
    const char *slash = strchr(target, '/');
    size_t plen = slash ? (size_t)(slash - target) : strlen(target);
    const struct cfg_provider *p = cfg_find_provider(c, target, plen);
    char head[200];
    size_t pos = 0;
    out[0] = '\0';
    if (p) {
        snprintf(head, sizeof(head), "provider \"%s\" has no route \"%.64s\"; its routes: ",
                 p->name, slash ? slash + 1 : "");
        pos = append(out, len, pos, head);
        for (size_t i = 0; i < p->n_routes; i++) {
            pos = append(out, len, pos, i ? ", " : "");
            pos = append(out, len, pos, p->routes[i].route);
        }
        return;
    }
    snprintf(head, sizeof(head), "no provider \"%.*s\" is configured; the providers: ",
             (int)(plen < 64 ? plen : 64), target);
    pos = append(out, len, pos, head);
    for (size_t i = 0; i < c->n_providers; i++) {
        pos = append(out, len, pos, i ? ", " : "");
        pos = append(out, len, pos, c->providers[i].name);
    }
    if (!c->n_providers)
        (void)append(out, len, pos, "none");
}

void cfg_print_reference(void)
{
    printf("| setting | environment | default | meaning |\n|---|---|---|---|\n");
    for (size_t i = 0; i < N_SETTINGS; i++)
        printf("| `%s` | `%s` | `%s` | %s |\n", settings[i].name, settings[i].env,
               settings[i].def, settings[i].doc);
}

int cfg_providers_literal(const struct cfg *cfg, int (*skip)(int i, void *arg), void *arg,
                          char *buf, size_t len)
{
    size_t pos = 0;
    int n = 0;
    buf[pos++] = '{';
    for (size_t i = 0; i < cfg->n_providers; i++) {
        const char *name = cfg->providers[i].name;
        size_t k = strlen(name);
        if ((skip && skip((int)i, arg)) || pos + k + 3 >= len)
            continue;
        if (n++)
            buf[pos++] = ',';
        memcpy(buf + pos, name, k);
        pos += k;
    }
    buf[pos++] = '}';
    buf[pos] = '\0';
    return n;
}
