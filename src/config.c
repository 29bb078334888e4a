#include "idemgate/config.h"

#include "idemgate/tmpl.h"

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
    {"database_url", "DATABASE_URL", T_STR, OFF(database_url), "postgresql:///idemgate", 0, 0,
     "libpq connection string of the PostgreSQL database"},
    {"dispatch_workers", "IDEMGATE_DISPATCH_WORKERS", T_INT, OFF(dispatch_workers), "2", 0, 256,
     "dispatcher threads in this replica (0: this replica only takes requests)"},
    {"http_threads", "IDEMGATE_HTTP_THREADS", T_INT, OFF(http_threads), "4", 1, 256,
     "HTTP server threads; each holds one database connection"},
    {"instance_id", "IDEMGATE_INSTANCE_ID", T_STR, OFF(instance_id), "", 0, 0,
     "lease owner name of this replica (default host:pid)"},
    {"job_ttl_hours", "IDEMGATE_JOB_TTL_HOURS", T_INT, OFF(job_ttl_hours), "168", 1, 87600,
     "how long a job and its key are kept"},
    {"lease_seconds", "IDEMGATE_LEASE_SECONDS", T_INT, OFF(lease_seconds), "60", 2, 3600,
     "lease of a dispatch; must exceed every provider's total timeout"},
    {"listen", "IDEMGATE_LISTEN", T_STR, OFF(listen_host), "127.0.0.1:8080", 0, 0,
     "HOST:PORT the HTTP API listens on"},
    {"log_level", "IDEMGATE_LOG_LEVEL", T_STR, OFF(log_level), "info", 0, 0,
     "debug, info, warn or error"},
    {"max_body_bytes", "IDEMGATE_MAX_BODY_BYTES", T_LONG, OFF(max_body_bytes), "1048576", 2,
     64L * 1024 * 1024, "largest request body accepted (413 above)"},
    {"max_connections", "IDEMGATE_MAX_CONNECTIONS", T_INT, OFF(max_connections), "4096", 16,
     100000, "concurrent client connections, suspended ones included"},
    {"max_json_depth", "IDEMGATE_MAX_JSON_DEPTH", T_INT, OFF(max_json_depth), "64", 1, 1024,
     "deepest nesting of arrays and objects accepted in a body"},
    {"max_wait_seconds", "IDEMGATE_MAX_WAIT_SECONDS", T_INT, OFF(max_wait_seconds), "60", 0, 3600,
     "cap on Prefer: wait=N"},
    {"poll_interval_ms", "IDEMGATE_POLL_INTERVAL_MS", T_INT, OFF(poll_interval_ms), "1000", 10,
     60000, "dispatcher fallback poll when no NOTIFY arrives"},
    {"reconcile_workers", "IDEMGATE_RECONCILE_WORKERS", T_INT, OFF(reconcile_workers), "1", 0, 64,
     "reconciler threads in this replica (resolve unknown operations)"},
    {"reaper_interval_ms", "IDEMGATE_REAPER_INTERVAL_MS", T_INT, OFF(reaper_interval_ms), "1000",
     0, 600000, "how often expired leases are turned into unknown (0: never, in this replica)"},
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

static char *dup_str(const cJSON *o, const char *key, const char *def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsString(v))
        return strdup(v->valuestring);
    return def ? strdup(def) : NULL;
}

static int load_routes(struct cfg_provider *p, const cJSON *arr, const char *file, char *err,
                       size_t errlen)
{
    int n = cJSON_GetArraySize(arr);
    if (!cJSON_IsArray(arr) || n == 0) {
        errf(err, errlen, "%s: providers.%s.routes must be a non-empty array", file, p->name);
        return -1;
    }
    p->routes = calloc((size_t)n, sizeof(*p->routes));
    if (!p->routes)
        return -1;
    const cJSON *r;
    cJSON_ArrayForEach(r, arr)
    {
        struct cfg_route *rt = &p->routes[p->n_routes];
        rt->route = dup_str(r, "route", NULL);
        rt->method = dup_str(r, "method", "POST");
        rt->path = dup_str(r, "path", NULL);
        p->n_routes++;
        if (!rt->route || !rt->path || !*rt->route || rt->route[0] == '/' || rt->path[0] != '/') {
            errf(err, errlen,
                 "%s: providers.%s.routes[%zu]: \"route\" (no leading /) and \"path\" (leading /) "
                 "are required",
                 file, p->name, p->n_routes - 1);
            return -1;
        }
    }
    return 0;
}

static long get_long(const cJSON *o, const char *key, long def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? (long)v->valuedouble : def;
}

static const char *const reconcile_names[] = {"none", "idempotent_resubmit", "get_by_client_id",
                                              "list_match"};

const char *cfg_reconcile_name(enum cfg_reconcile r)
{
    return (unsigned)r < 4 ? reconcile_names[r] : "none";
}

/* Compiles the JSONPath at o[key] into *out (left NULL when absent). */
static int load_path(const cJSON *o, const char *key, struct jpath **out, int required,
                     const char *file, const char *field, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    const char *why = NULL;
    *out = NULL;
    if (!v) {
        if (!required)
            return 0;
        errf(err, errlen, "%s: %s.%s is required", file, field, key);
        return -1;
    }
    if (!cJSON_IsString(v) || jpath_compile(v->valuestring, out, &why) < 0) {
        errf(err, errlen, "%s: %s.%s: not a JSONPath (%s)", file, field, key,
             why ? why : "must be a string");
        return -1;
    }
    return 0;
}

static int load_template(const cJSON *o, const char *key, char **out, const char *const *allowed,
                         const char *file, const char *field, char *err, size_t errlen)
{
    char why[160];
    *out = dup_str(o, key, NULL);
    if (!*out) {
        errf(err, errlen, "%s: %s.%s is required", file, field, key);
        return -1;
    }
    if ((*out)[0] != '/' || tmpl_validate(*out, allowed, why, sizeof(why)) < 0) {
        errf(err, errlen, "%s: %s.%s: %s", file, field, key,
             (*out)[0] != '/' ? "must start with /" : why);
        return -1;
    }
    return 0;
}

/* The failure-semantics part of a provider: idempotency, client reference, retry, reconcile,
 * outputs and probe. */
static int load_semantics(struct cfg_provider *p, const cJSON *o, const char *file, char *err,
                          size_t errlen)
{
    char field[160];
    const cJSON *idem = cJSON_GetObjectItemCaseSensitive(o, "idempotency");
    p->idem_header = idem ? dup_str(idem, "header", NULL) : NULL;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(o, "client_ref");
    p->client_ref_header = ref ? dup_str(ref, "header", NULL) : NULL;
    p->client_ref_body_field = ref ? dup_str(ref, "body_field", NULL) : NULL;

    const cJSON *retry = cJSON_GetObjectItemCaseSensitive(o, "retry");
    p->max_attempts = (int)get_long(retry, "max_attempts", 5);
    p->deadline_ms = get_long(retry, "deadline_seconds", 900) * 1000;
    p->backoff_base_ms = get_long(retry, "base_ms", 500);
    p->backoff_cap_ms = get_long(retry, "cap_ms", 30000);
    if (p->max_attempts < 1 || p->max_attempts > 1000 || p->deadline_ms < 1000 ||
        p->backoff_base_ms < 1 || p->backoff_cap_ms < p->backoff_base_ms) {
        errf(err, errlen,
             "%s: providers.%s.retry: need 1 <= max_attempts <= 1000, deadline_seconds >= 1, "
             "1 <= base_ms <= cap_ms",
             file, p->name);
        return -1;
    }
    const cJSON *hint = cJSON_GetObjectItemCaseSensitive(retry, "body_hint");
    if (hint) {
        const char *pat = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(hint, "pattern"));
        long unit = get_long(hint, "unit_ms", 1000);
        if (!pat || bo_body_hint_compile(&p->body_hint, pat, unit, 1) < 0) {
            errf(err, errlen,
                 "%s: providers.%s.retry.body_hint: \"pattern\" must be a POSIX extended regex "
                 "with one capture group for the number",
                 file, p->name);
            return -1;
        }
    }

    const cJSON *rec = cJSON_GetObjectItemCaseSensitive(o, "reconcile");
    const char *strategy = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rec, "strategy"));
    p->reconcile = p->idem_header ? RECON_IDEMPOTENT_RESUBMIT : RECON_NONE;
    if (strategy) {
        int found = 0;
        for (int i = 0; i < 4; i++)
            if (strcmp(strategy, reconcile_names[i]) == 0) {
                p->reconcile = (enum cfg_reconcile)i;
                found = 1;
            }
        if (!found) {
            errf(err, errlen,
                 "%s: providers.%s.reconcile.strategy must be none, idempotent_resubmit, "
                 "get_by_client_id or list_match",
                 file, p->name);
            return -1;
        }
    }
    if (p->reconcile == RECON_IDEMPOTENT_RESUBMIT && !p->idem_header) {
        errf(err, errlen,
             "%s: providers.%s.reconcile.strategy idempotent_resubmit needs idempotency.header",
             file, p->name);
        return -1;
    }
    p->recovery_window_ms = get_long(rec, "window_seconds", 900) * 1000;
    p->reconcile_interval_ms = get_long(rec, "interval_ms", 2000);
    if (p->recovery_window_ms < 1000 || p->reconcile_interval_ms < 10) {
        errf(err, errlen, "%s: providers.%s.reconcile: window_seconds >= 1, interval_ms >= 10",
             file, p->name);
        return -1;
    }
    static const char *const lookup_vars[] = {"client_ref", NULL};
    static const char *const list_vars[] = {"since", "until", NULL};
    if (p->reconcile == RECON_GET_BY_CLIENT_ID) {
        const cJSON *lk = cJSON_GetObjectItemCaseSensitive(rec, "lookup");
        snprintf(field, sizeof(field), "providers.%s.reconcile.lookup", p->name);
        if (load_template(lk, "path", &p->lookup_path, lookup_vars, file, field, err, errlen) <
                0 ||
            load_path(lk, "id", &p->lookup_id, 0, file, field, err, errlen) < 0)
            return -1;
    }
    if (p->reconcile == RECON_LIST_MATCH) {
        const cJSON *ls = cJSON_GetObjectItemCaseSensitive(rec, "list");
        snprintf(field, sizeof(field), "providers.%s.reconcile.list", p->name);
        if (load_template(ls, "path", &p->list_path, list_vars, file, field, err, errlen) < 0 ||
            load_path(ls, "items", &p->list_items, 1, file, field, err, errlen) < 0 ||
            load_path(ls, "match", &p->list_match, 1, file, field, err, errlen) < 0 ||
            load_path(ls, "id", &p->list_id, 0, file, field, err, errlen) < 0)
            return -1;
    }
    if ((p->reconcile == RECON_GET_BY_CLIENT_ID || p->reconcile == RECON_LIST_MATCH) &&
        !p->client_ref_header && !p->client_ref_body_field) {
        /* Without a reference sent with the create there is nothing to match on. */
        errf(err, errlen, "%s: providers.%s.reconcile.strategy %s needs client_ref", file,
             p->name, reconcile_names[p->reconcile]);
        return -1;
    }

    const cJSON *outs = cJSON_GetObjectItemCaseSensitive(o, "outputs");
    snprintf(field, sizeof(field), "providers.%s.outputs", p->name);
    if (load_path(outs, "requested", &p->outputs_requested, 0, file, field, err, errlen) < 0 ||
        load_path(outs, "received", &p->outputs_received, 0, file, field, err, errlen) < 0 ||
        load_path(outs, "usage", &p->usage, 0, file, field, err, errlen) < 0)
        return -1;
    p->outputs_default = (int)get_long(outs, "default", 1);
    const cJSON *probe = cJSON_GetObjectItemCaseSensitive(o, "probe");
    p->probe_path = probe ? dup_str(probe, "path", NULL) : NULL;
    if (probe && (!p->probe_path || p->probe_path[0] != '/')) {
        errf(err, errlen, "%s: providers.%s.probe.path must start with /", file, p->name);
        return -1;
    }
    return 0;
}

static int load_providers(struct cfg *c, const cJSON *arr, const char *file, char *err,
                          size_t errlen)
{
    int n = cJSON_GetArraySize(arr);
    if (!cJSON_IsArray(arr)) {
        errf(err, errlen, "%s: providers must be an array", file);
        return -1;
    }
    c->providers = calloc((size_t)n + 1, sizeof(*c->providers));
    if (!c->providers)
        return -1;
    const cJSON *o;
    cJSON_ArrayForEach(o, arr)
    {
        struct cfg_provider *p = &c->providers[c->n_providers++];
        p->name = dup_str(o, "name", NULL);
        if (!p->name || !*p->name || strspn(p->name, "abcdefghijklmnopqrstuvwxyz0123456789-_") !=
                                         strlen(p->name)) {
            errf(err, errlen, "%s: providers[%zu].name must be [a-z0-9_-]+", file,
                 c->n_providers - 1);
            return -1;
        }
        for (size_t i = 0; i + 1 < c->n_providers; i++) {
            if (strcmp(c->providers[i].name, p->name) == 0) {
                errf(err, errlen, "%s: providers.%s is declared twice", file, p->name);
                return -1;
            }
        }
        p->base_url = dup_str(o, "base_url", NULL);
        if (!p->base_url || (strncmp(p->base_url, "http://", 7) && strncmp(p->base_url, "https://", 8))) {
            errf(err, errlen, "%s: providers.%s.base_url must be an http(s) URL", file, p->name);
            return -1;
        }
        size_t bl = strlen(p->base_url);
        if (bl && p->base_url[bl - 1] == '/')
            p->base_url[bl - 1] = '\0';
        const char *mode = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "mode"));
        if (mode && strcmp(mode, "sync") != 0) {
            errf(err, errlen, "%s: providers.%s.mode \"%s\" is not supported (sync)", file,
                 p->name, mode);
            return -1;
        }
        p->mode = CFG_MODE_SYNC;
        const cJSON *auth = cJSON_GetObjectItemCaseSensitive(o, "auth");
        if (auth) {
            p->auth_header = dup_str(auth, "header", "Authorization");
            p->auth_prefix = dup_str(auth, "prefix", "");
            p->secret_env = dup_str(auth, "secret_env", NULL);
            if (!p->secret_env || !*p->secret_env) {
                errf(err, errlen, "%s: providers.%s.auth.secret_env is required", file, p->name);
                return -1;
            }
        }
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "timeouts");
        p->connect_timeout_ms = get_long(t, "connect_ms", 5000);
        p->total_timeout_ms = get_long(t, "total_ms", 30000);
        if (p->connect_timeout_ms < 1 || p->total_timeout_ms < p->connect_timeout_ms) {
            errf(err, errlen, "%s: providers.%s.timeouts: need 1 <= connect_ms <= total_ms", file,
                 p->name);
            return -1;
        }
        if (load_routes(p, cJSON_GetObjectItemCaseSensitive(o, "routes"), file, err, errlen) < 0)
            return -1;
        if (load_semantics(p, o, file, err, errlen) < 0)
            return -1;
    }
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

static int split_listen(struct cfg *c, char *err, size_t errlen)
{
    char *colon = strrchr(c->listen_host, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || *end != '\0' || port < 0 || port > 65535) {
        errf(err, errlen, "listen must be HOST:PORT, got \"%s\"", c->listen_host);
        return -1;
    }
    *colon = '\0';
    c->listen_port = (int)port;
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
        const cJSON *item;
        cJSON_ArrayForEach(item, root)
        {
            if (strcmp(item->string, "providers") == 0)
                continue;
            const struct cfg_setting *s = NULL;
            for (size_t i = 0; i < N_SETTINGS; i++)
                if (strcmp(settings[i].name, item->string) == 0)
                    s = &settings[i];
            if (!s) {
                errf(err, errlen, "%s: unknown setting \"%s\"", path, item->string);
                goto failed;
            }
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
                goto failed;
            }
            if (set_value(c, s, v, path, err, errlen) < 0)
                goto failed;
        }
        const cJSON *provs = cJSON_GetObjectItemCaseSensitive(root, "providers");
        if (provs && load_providers(c, provs, path, err, errlen) < 0)
            goto failed;
    }
    for (size_t i = 0; i < N_SETTINGS; i++) {
        const char *v = getenv(settings[i].env);
        char where[128];
        snprintf(where, sizeof(where), "environment %s", settings[i].env);
        if (v && *v && set_value(c, &settings[i], v, where, err, errlen) < 0)
            goto failed;
    }
    if (split_listen(c, err, errlen) < 0)
        goto failed;
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
        goto failed;
    }
    for (size_t i = 0; i < c->n_providers; i++) {
        /* A lease shorter than a call would let the reaper declare a live call unknown. */
        if (c->providers[i].total_timeout_ms + 2000 > (long)c->lease_seconds * 1000) {
            errf(err, errlen,
                 "%s: lease_seconds (%d) must exceed providers.%s.timeouts.total_ms (%ld) by 2 s",
                 file, c->lease_seconds, c->providers[i].name, c->providers[i].total_timeout_ms);
            goto failed;
        }
    }
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
    for (size_t i = 0; i < c->n_providers; i++) {
        struct cfg_provider *p = &c->providers[i];
        for (size_t j = 0; j < p->n_routes; j++) {
            free(p->routes[j].route);
            free(p->routes[j].method);
            free(p->routes[j].path);
        }
        free(p->routes);
        free(p->name);
        free(p->base_url);
        free(p->auth_header);
        free(p->auth_prefix);
        free(p->secret_env);
        free(p->idem_header);
        free(p->client_ref_header);
        free(p->client_ref_body_field);
        bo_body_hint_free(&p->body_hint);
        free(p->lookup_path);
        jpath_free(p->lookup_id);
        free(p->list_path);
        jpath_free(p->list_items);
        jpath_free(p->list_match);
        jpath_free(p->list_id);
        jpath_free(p->outputs_requested);
        jpath_free(p->outputs_received);
        jpath_free(p->usage);
        free(p->probe_path);
    }
    free(c->providers);
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

void cfg_print_reference(void)
{
    printf("| setting | environment | default | meaning |\n|---|---|---|---|\n");
    for (size_t i = 0; i < N_SETTINGS; i++)
        printf("| `%s` | `%s` | `%s` | %s |\n", settings[i].name, settings[i].env,
               settings[i].def, settings[i].doc);
}
