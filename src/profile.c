#include "idemgate/profile.h"
#include "idemgate/crypto.h"
#include "idemgate/jcs.h"
#include "idemgate/secrets.h"
#include "idemgate/sse.h"

#include "idemgate/members.h"
#include "idemgate/tmpl.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const status_names[TS__COUNT] = {"queued", "running", "succeeded", "failed",
                                                     "canceled"};

/* The members a provider may have, in its configuration entry or in a profile file: every name
 * the loaders below read, and nothing else (members.h). A loader that reads a new member needs it
 * here too, or a configuration that sets it is refused. */
static const struct memb auth_m[] = {
    {"header", MEMB_VALUE, NULL},       {"prefix", MEMB_VALUE, NULL},
    {"secret_env", MEMB_VALUE, NULL},   {"secret_file", MEMB_VALUE, NULL},
    {"trip_markers", MEMB_VALUE, NULL}, {"trip_statuses", MEMB_VALUE, NULL},
};
static const struct memb_table auth_t = MEMB_TABLE(auth_m, NULL);
static const struct memb timeouts_m[] = {{"connect_ms", MEMB_VALUE, NULL},
                                         {"create_total_ms", MEMB_VALUE, NULL},
                                         {"total_ms", MEMB_VALUE, NULL},
                                         {"keepalive_seconds", MEMB_VALUE, NULL}};
static const struct memb_table timeouts_t = MEMB_TABLE(timeouts_m, NULL);
static const struct memb tls_m[] = {{"ca_file", MEMB_VALUE, NULL}};
static const struct memb_table tls_t = MEMB_TABLE(tls_m, NULL);
static const struct memb route_m[] = {
    {"default_wait_seconds", MEMB_VALUE, NULL}, {"method", MEMB_VALUE, NULL},
    {"multipart", MEMB_VALUE, NULL},            {"path", MEMB_VALUE, NULL},
    {"route", MEMB_VALUE, NULL},
};
static const struct memb_table route_t = MEMB_TABLE(route_m, NULL);
static const struct memb idem_m[] = {{"header", MEMB_VALUE, NULL}};
static const struct memb_table idem_t = MEMB_TABLE(idem_m, NULL);
static const struct memb client_ref_m[] = {{"body_field", MEMB_VALUE, NULL},
                                           {"header", MEMB_VALUE, NULL}};
static const struct memb_table client_ref_t = MEMB_TABLE(client_ref_m, NULL);
static const struct memb body_hint_m[] = {{"pattern", MEMB_VALUE, NULL},
                                          {"unit_ms", MEMB_VALUE, NULL}};
static const struct memb_table body_hint_t = MEMB_TABLE(body_hint_m, NULL);
static const struct memb retry_m[] = {
    {"base_ms", MEMB_VALUE, NULL},          {"body_hint", MEMB_OBJECT, &body_hint_t},
    {"cap_ms", MEMB_VALUE, NULL},           {"deadline_seconds", MEMB_VALUE, NULL},
    {"max_attempts", MEMB_VALUE, NULL},     {"not_created_statuses", MEMB_VALUE, NULL},
};
static const struct memb_table retry_t = MEMB_TABLE(retry_m, NULL);
static const struct memb resume_m[] = {{"query", MEMB_VALUE, NULL},
                                       {"sequence", MEMB_VALUE, NULL},
                                       {"start_query", MEMB_VALUE, NULL},
                                       {"when", MEMB_VALUE, NULL}};
static const struct memb_table resume_t = MEMB_TABLE(resume_m, NULL);
static const struct memb task_m[] = {{"client_ref", MEMB_VALUE, NULL},
                                     {"path", MEMB_VALUE, NULL},
                                     {"resume", MEMB_OBJECT, &resume_t}};
static const struct memb_table task_t = MEMB_TABLE(task_m, NULL);
static const struct memb absent_m[] = {{"equals", MEMB_VALUE, NULL}, {"path", MEMB_VALUE, NULL}};
static const struct memb_table absent_t = MEMB_TABLE(absent_m, NULL);
static const struct memb lookup_m[] = {{"absent", MEMB_OBJECT, &absent_t},
                                       {"client_ref", MEMB_VALUE, NULL},
                                       {"id", MEMB_VALUE, NULL},
                                       {"path", MEMB_VALUE, NULL}};
static const struct memb_table lookup_t = MEMB_TABLE(lookup_m, NULL);
static const struct memb list_m[] = {
    {"cursor_param", MEMB_VALUE, NULL}, {"id", MEMB_VALUE, NULL},
    {"items", MEMB_VALUE, NULL},        {"match", MEMB_VALUE, NULL},
    {"max_pages", MEMB_VALUE, NULL},    {"next_cursor", MEMB_VALUE, NULL},
    {"path", MEMB_VALUE, NULL},         {"single_page", MEMB_VALUE, NULL},
};
static const struct memb_table list_t = MEMB_TABLE(list_m, NULL);
/* found_status.map is the provider's own words: any member names. */
static const struct memb found_status_m[] = {
    {"deadline_seconds", MEMB_VALUE, NULL}, {"id", MEMB_VALUE, NULL},
    {"interval_ms", MEMB_VALUE, NULL},      {"map", MEMB_VALUE, NULL},
    {"max_interval_ms", MEMB_VALUE, NULL},  {"path", MEMB_VALUE, NULL},
};
static const struct memb_table found_status_t = MEMB_TABLE(found_status_m, NULL);
static const struct memb reconcile_m[] = {
    {"absent_grace_ms", MEMB_VALUE, NULL}, {"found_result", MEMB_VALUE, NULL},
    {"found_status", MEMB_OBJECT, &found_status_t},
    {"interval_ms", MEMB_VALUE, NULL},     {"list", MEMB_OBJECT, &list_t},
    {"lookup", MEMB_OBJECT, &lookup_t},    {"strategy", MEMB_VALUE, NULL},
    {"task", MEMB_OBJECT, &task_t},        {"window_seconds", MEMB_VALUE, NULL},
};
static const struct memb_table reconcile_t = MEMB_TABLE(reconcile_m, NULL);
static const struct memb outputs_m[] = {
    {"default", MEMB_VALUE, NULL},  {"received", MEMB_VALUE, NULL},
    {"requested", MEMB_VALUE, NULL}, {"usage", MEMB_VALUE, NULL},
};
static const struct memb_table outputs_t = MEMB_TABLE(outputs_m, NULL);
static const struct memb probe_m[] = {{"path", MEMB_VALUE, NULL}};
static const struct memb_table probe_t = MEMB_TABLE(probe_m, NULL);
static const struct memb create_m[] = {
    {"accepted_statuses", MEMB_VALUE, NULL},
    {"poll_url", MEMB_VALUE, NULL},
    {"task_id", MEMB_VALUE, NULL},
};
static const struct memb_table create_t = MEMB_TABLE(create_m, NULL);
/* poll.body is the provider's own JSON: any member names. */
static const struct memb poll_m[] = {
    {"body", MEMB_VALUE, NULL},          {"deadline_seconds", MEMB_VALUE, NULL},
    {"hint_header", MEMB_VALUE, NULL},   {"interval_ms", MEMB_VALUE, NULL},
    {"max_interval_ms", MEMB_VALUE, NULL}, {"method", MEMB_VALUE, NULL},
    {"path", MEMB_VALUE, NULL},
};
static const struct memb_table poll_t = MEMB_TABLE(poll_m, NULL);
/* status.map is keyed by the provider's status words. */
static const struct memb status_m[] = {
    {"by_http_status", MEMB_VALUE, NULL}, {"done", MEMB_VALUE, NULL},
    {"error", MEMB_VALUE, NULL},          {"map", MEMB_VALUE, NULL},
    {"path", MEMB_VALUE, NULL},
};
static const struct memb_table status_t = MEMB_TABLE(status_m, NULL);
static const struct memb result_m[] = {
    {"content_path", MEMB_VALUE, NULL}, {"error", MEMB_VALUE, NULL},
    {"expires_at", MEMB_VALUE, NULL},   {"fetch_from_poll_url_strip", MEMB_VALUE, NULL},
    {"fetch_path", MEMB_VALUE, NULL},   {"fetch_url", MEMB_VALUE, NULL},
    {"kind", MEMB_VALUE, NULL},         {"output_url", MEMB_VALUE, NULL},
    {"filtered", MEMB_VALUE, NULL},     {"outputs", MEMB_VALUE, NULL},
    {"url_ttl_seconds", MEMB_VALUE, NULL},
};
static const struct memb_table result_t = MEMB_TABLE(result_m, NULL);
static const struct memb cancel_m[] = {
    {"deletes", MEMB_VALUE, NULL}, {"method", MEMB_VALUE, NULL}, {"path", MEMB_VALUE, NULL}};
static const struct memb_table cancel_t = MEMB_TABLE(cancel_m, NULL);
static const struct memb webhook_m[] = {
    {"body_field", MEMB_VALUE, NULL},       {"client_ref", MEMB_VALUE, NULL},
    {"event_id", MEMB_VALUE, NULL},         {"redelivery_window_hours", MEMB_VALUE, NULL},
    {"secret_env", MEMB_VALUE, NULL},       {"signature_header", MEMB_VALUE, NULL},
    {"task_id", MEMB_VALUE, NULL},          {"url_query", MEMB_VALUE, NULL},
    {"verify", MEMB_VALUE, NULL},
};
static const struct memb_table webhook_t = MEMB_TABLE(webhook_m, NULL);
/* headers holds the extra request headers by name. */
static const struct memb provider_m[] = {
    {"archive", MEMB_OBJECT, &archprof_members},
    {"auth", MEMB_OBJECT, &auth_t},
    {"base_url", MEMB_VALUE, NULL},
    {"cancel", MEMB_OBJECT, &cancel_t},
    {"client_ref", MEMB_OBJECT, &client_ref_t},
    {"create", MEMB_OBJECT, &create_t},
    {"headers", MEMB_VALUE, NULL},
    {"id", MEMB_VALUE, NULL},
    {"idempotency", MEMB_OBJECT, &idem_t},
    {"max_inflight_calls", MEMB_VALUE, NULL},
    {"max_response_bytes", MEMB_VALUE, NULL},
    {"mode", MEMB_VALUE, NULL},
    {"outputs", MEMB_OBJECT, &outputs_t},
    {"poll", MEMB_OBJECT, &poll_t},
    {"pricing", MEMB_OBJECT, &price_table_members},
    {"probe", MEMB_OBJECT, &probe_t},
    {"proxy", MEMB_VALUE, NULL},
    {"reconcile", MEMB_OBJECT, &reconcile_t},
    {"result", MEMB_OBJECT, &result_t},
    {"retry", MEMB_OBJECT, &retry_t},
    {"routes", MEMB_ARRAY, &route_t},
    {"status", MEMB_OBJECT, &status_t},
    {"stream", MEMB_VALUE, NULL},
    {"timeouts", MEMB_OBJECT, &timeouts_t},
    {"tls", MEMB_OBJECT, &tls_t},
    {"webhook", MEMB_OBJECT, &webhook_t},
};
/* A profile file holds the provider members; an entry names the provider and may name a profile
 * whose members its own override. */
static const struct memb_table profile_t = MEMB_TABLE(provider_m, NULL);
static const struct memb entry_m[] = {{"name", MEMB_VALUE, NULL}, {"profile", MEMB_VALUE, NULL}};
const struct memb_table prof_entry_members = MEMB_TABLE(entry_m, &profile_t);

const char *prof_status_name(enum task_status s)
{
    return (unsigned)s < TS__COUNT ? status_names[s] : "unknown";
}

static void errf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static char *dup_str(const cJSON *o, const char *key, const char *def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsString(v))
        return strdup(v->valuestring);
    return def ? strdup(def) : NULL;
}

static int get_int(const cJSON *o, const char *key, int def);

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
        rt->default_wait_s = get_int(r, "default_wait_seconds", 0);
        const cJSON *mp = cJSON_GetObjectItemCaseSensitive(r, "multipart");
        rt->multipart = cJSON_IsTrue(mp);
        p->n_routes++;
        if (mp && !cJSON_IsBool(mp)) {
            errf(err, errlen, "%s: providers.%s.routes[%zu].multipart must be true or false",
                 file, p->name, p->n_routes - 1);
            return -1;
        }
        if (!rt->route || !rt->path || !*rt->route || rt->route[0] == '/' || rt->path[0] != '/') {
            errf(err, errlen,
                 "%s: providers.%s.routes[%zu]: \"route\" (no leading /) and \"path\" (leading /) "
                 "are required",
                 file, p->name, p->n_routes - 1);
            return -1;
        }
        if (rt->default_wait_s < 0 || rt->default_wait_s > 3600) {
            errf(err, errlen, "%s: providers.%s.routes[%zu].default_wait_seconds must be 0..3600",
                 file, p->name, p->n_routes - 1);
            return -1;
        }
    }
    return 0;
}

/* Integer fields arrive as JSON doubles. Beyond +-2^53 (1e300, or 1e999, which cJSON reads as
 * infinity) a value is clamped there: converting it as it is would be undefined, a number of
 * seconds times 1000 must still fit a long, and a clamped value stays too large (or too small)
 * for the bounds each field is then checked against, instead of wrapping into them. */
#define PROF_INT_LIMIT 9007199254740992.0 /* 2^53 */

static long get_long(const cJSON *o, const char *key, long def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v))
        return def;
    double d = v->valuedouble;
    if (!(d > -PROF_INT_LIMIT)) /* NaN too */
        return (long)-PROF_INT_LIMIT;
    if (d > PROF_INT_LIMIT)
        return (long)PROF_INT_LIMIT;
    return (long)d;
}

/* get_long for an int field: clamped to the int range, never wrapped (4294967301 is not 5). */
static int get_int(const cJSON *o, const char *key, int def)
{
    long v = get_long(o, key, def);
    return v > INT_MAX ? INT_MAX : v < INT_MIN ? INT_MIN : (int)v;
}

int prof_status_in(const int *list, int n, int status)
{
    for (int i = 0; i < n; i++)
        if (list[i] == status)
            return 1;
    return 0;
}

/* Reads o[key], an array of HTTP statuses in lo..hi, into out (at most cap); absent: the
 * defaults. Returns 0, or -1 with a message naming field.key. */
static int load_statuses(const cJSON *o, const char *key, int *out, int cap, int *n,
                         const int *def, int ndef, int lo, int hi, const char *file,
                         const char *field, char *err, size_t errlen)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, key);
    *n = 0;
    if (!arr) {
        for (int i = 0; i < ndef && i < cap; i++)
            out[(*n)++] = def[i];
        return 0;
    }
    const cJSON *v;
    int ok = cJSON_IsArray(arr);
    cJSON_ArrayForEach(v, arr)
    {
        if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi || *n == cap) {
            ok = 0;
            break;
        }
        out[(*n)++] = (int)v->valuedouble;
    }
    if (!ok) {
        errf(err, errlen, "%s: %s.%s: an array of up to %d statuses in %d..%d", file, field, key,
             cap, lo, hi);
        return -1;
    }
    return 0;
}

/* auth.secret_env or auth.secret_file, exactly one: where the secret is (secrets.h). A file is
 * named by its absolute path (the working directory of a service is no place to look for it). */
static int load_credential(struct cfg_provider *p, const cJSON *auth, const char *file, char *err,
                           size_t errlen)
{
    const cJSON *env = cJSON_GetObjectItemCaseSensitive(auth, "secret_env");
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(auth, "secret_file");
    const size_t k = strlen(SECRET_FILE_PREFIX);
    if (!env == !path) {
        errf(err, errlen, "%s: providers.%s.auth: exactly one of secret_env and secret_file is "
             "required", file, p->name);
        return -1;
    }
    if (env && (!cJSON_IsString(env) || !*env->valuestring ||
                strncmp(env->valuestring, SECRET_FILE_PREFIX, k) == 0)) {
        errf(err, errlen, "%s: providers.%s.auth.secret_env: an environment variable's name",
             file, p->name);
        return -1;
    }
    if (path && (!cJSON_IsString(path) || path->valuestring[0] != '/')) {
        errf(err, errlen, "%s: providers.%s.auth.secret_file: an absolute path", file, p->name);
        return -1;
    }
    const char *v = env ? env->valuestring : path->valuestring;
    size_t n = (path ? k : 0) + strlen(v) + 1;
    if (!(p->credential = malloc(n))) {
        errf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(p->credential, n, "%s%s", path ? SECRET_FILE_PREFIX : "", v);
    return 0;
}

/* auth.trip_markers: up to 8 strings of 1..128 printable ASCII bytes, matched byte for byte in
 * a refusal's body (classify.h). */
static int load_trip_markers(struct cfg_provider *p, const cJSON *auth, const char *file,
                             char *err, size_t errlen)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(auth, "trip_markers");
    const cJSON *v;
    if (!arr)
        return 0;
    int ok = cJSON_IsArray(arr);
    cJSON_ArrayForEach(v, arr)
    {
        const char *m = cJSON_GetStringValue(v);
        size_t len = m ? strlen(m) : 0;
        int printable = len > 0 && len <= 128;
        for (size_t i = 0; printable && i < len; i++)
            printable = m[i] >= 0x20 && m[i] < 0x7f;
        if (!printable || p->n_trip_markers == 8) {
            ok = 0;
            break;
        }
        p->trip_markers[p->n_trip_markers] = strdup(m);
        if (!p->trip_markers[p->n_trip_markers])
            return -1;
        p->n_trip_markers++;
    }
    if (!ok) {
        errf(err, errlen,
             "%s: providers.%s.auth.trip_markers: an array of up to 8 strings of 1 to 128 "
             "printable ASCII characters",
             file, p->name);
        return -1;
    }
    return 0;
}

static const char *const reconcile_names[] = {"none", "idempotent_resubmit", "get_by_client_id",
                                              "list_match"};

const char *prof_reconcile_name(enum cfg_reconcile r)
{
    return (unsigned)r < 4 ? reconcile_names[r] : "none";
}

int prof_reconcile_parse(const char *s)
{
    for (int i = 0; s && i < 4; i++)
        if (strcmp(s, reconcile_names[i]) == 0)
            return i;
    return -1;
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
/* retry: the statuses that prove nothing was made, the budget and backoff, a body hint. */
static int load_retry(struct cfg_provider *p, const cJSON *o, const char *file, char *err,
                      size_t errlen)
{
    char field[160];
    const cJSON *retry = cJSON_GetObjectItemCaseSensitive(o, "retry");
    /* Only a status the provider documents as "nothing was made" is safe to resend without a
     * native key; every other 5xx may arrive after the origin accepted the work. */
    static const int not_created_default[] = {408, 425, 429};
    snprintf(field, sizeof(field), "providers.%s.retry", p->name);
    if (load_statuses(retry, "not_created_statuses", p->not_created, 16, &p->n_not_created,
                      not_created_default, 3, 400, 599, file, field, err, errlen) < 0)
        return -1;
    p->max_attempts = get_int(retry, "max_attempts", 5);
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

    return 0;
}

/* reconcile: the strategy, its window and grace. */
static int load_reconcile(struct cfg_provider *p, const cJSON *o, const char *file, char *err,
                          size_t errlen)
{
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
    p->absent_grace_ms = get_long(rec, "absent_grace_ms", 30000);
    if (p->recovery_window_ms < 1000 || p->reconcile_interval_ms < 10 || p->absent_grace_ms < 0) {
        errf(err, errlen,
             "%s: providers.%s.reconcile: window_seconds >= 1, interval_ms >= 10, "
             "absent_grace_ms >= 0",
             file, p->name);
        return -1;
    }
    return 0;
}

static int load_status_map(struct cfg_provider *p, const cJSON *map, const char *file, char *err,
                           size_t errlen);
static int load_cancel(struct cfg_provider *p, const cJSON *o, const char *file, char *err,
                       size_t errlen);

/* reconcile.task.resume: how a cut stream the provider keeps generating is resumed (a query
 * added to the task's path, with {after}); only for a synchronous streaming profile whose task
 * is read by its own path. */
static int load_resume(struct cfg_provider *p, const cJSON *task, const char *file, char *err,
                       size_t errlen)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(task, "resume");
    if (!rs)
        return 0;
    char field[160], why[160];
    snprintf(field, sizeof(field), "providers.%s.reconcile.task.resume", p->name);
    if (p->mode == CFG_MODE_ASYNC_POLL || !p->task_path || !p->stream_format) {
        errf(err, errlen, "%s: %s: only for a sync provider with \"stream\" and "
             "reconcile.task.path", file, field);
        return -1;
    }
    static const char *const vars[] = {"after", NULL};
    p->resume_query = dup_str(rs, "query", NULL);
    if (!p->resume_query || !*p->resume_query || strchr("?&/", p->resume_query[0]) ||
        tmpl_validate(p->resume_query, vars, why, sizeof(why)) < 0 ||
        !strstr(p->resume_query, "{after}")) {
        errf(err, errlen, "%s: %s.query: %s", file, field,
             !p->resume_query || !*p->resume_query ? "is required"
             : strchr("?&/", p->resume_query[0]) ? "is the query alone, without '?', '&' or a path"
             : !strstr(p->resume_query, "{after}") ? "must hold {after}"
                                                  : why);
        return -1;
    }
    /* From the first event: no placeholder. */
    p->resume_start_query = dup_str(rs, "start_query", NULL);
    if (p->resume_start_query &&
        (!*p->resume_start_query || strchr("?&/", p->resume_start_query[0]) ||
         tmpl_validate(p->resume_start_query, NULL, why, sizeof(why)) < 0)) {
        errf(err, errlen, "%s: %s.start_query: %s", file, field,
             !*p->resume_start_query || strchr("?&/", p->resume_start_query[0])
                 ? "is the query alone, without '?', '&' or a path"
                 : why);
        return -1;
    }
    return load_path(rs, "when", &p->resume_when, 1, file, field, err, errlen) < 0 ||
                   load_path(rs, "sequence", &p->resume_sequence, 1, file, field, err, errlen) <
                       0
               ? -1
               : 0;
}

/* reconcile.task, .lookup and .list: how a task is read and found. */
static int load_reconcile_reads(struct cfg_provider *p, const cJSON *o, const char *file,
                                char *err, size_t errlen)
{
    char field[160];
    const cJSON *rec = cJSON_GetObjectItemCaseSensitive(o, "reconcile");
    const cJSON *task = cJSON_GetObjectItemCaseSensitive(rec, "task");
    static const char *const task_vars[] = {"id", NULL};
    snprintf(field, sizeof(field), "providers.%s.reconcile.task", p->name);
    /* An async provider's task is read by its poll path unless the profile says otherwise.
     * Its client_ref (where a task read shows our reference) is required where webhooks may
     * name a task, whose hint must be proven ours; without webhooks a task is read only by an
     * id our own create gave (a cut stream's) or an operator named. */
    int own_path = task && (p->mode != CFG_MODE_ASYNC_POLL ||
                            cJSON_GetObjectItemCaseSensitive(task, "path"));
    if (task && ((own_path && load_template(task, "path", &p->task_path, task_vars, file, field,
                                            err, errlen) < 0) ||
                 load_path(task, "client_ref", &p->task_client_ref,
                           cJSON_GetObjectItemCaseSensitive(o, "webhook") != NULL, file, field,
                           err, errlen) < 0))
        return -1;
    if (load_resume(p, task, file, err, errlen) < 0)
        return -1;
    snprintf(field, sizeof(field), "providers.%s.reconcile", p->name);
    if (load_path(rec, "found_result", &p->found_result, 0, file, field, err, errlen) < 0)
        return -1;
    /* A synchronous provider whose found task says how far it got (a response read back by
     * the id its stream gave: queued, in progress, completed…): its status, mapped as an
     * async profile's status is. An async profile reads its tasks' status by "status". */
    const cJSON *fs = cJSON_GetObjectItemCaseSensitive(rec, "found_status");
    if (fs) {
        snprintf(field, sizeof(field), "providers.%s.reconcile.found_status", p->name);
        if (p->mode == CFG_MODE_ASYNC_POLL || !p->task_path) {
            errf(err, errlen, "%s: %s: only for a sync provider with reconcile.task.path", file,
                 field);
            return -1;
        }
        if (load_path(fs, "path", &p->status_path, 1, file, field, err, errlen) < 0 ||
            load_status_map(p, cJSON_GetObjectItemCaseSensitive(fs, "map"), file, err, errlen) <
                0 ||
            load_path(fs, "id", &p->task_id, 0, file, field, err, errlen) < 0)
            return -1;
        /* A create answered still in progress (a background response) is followed by reads of
         * reconcile.task.path, as an async task is polled: its id where "id" says, its reads
         * spaced from interval_ms growing to max_interval_ms, for at most deadline_seconds. */
        const char *why = NULL;
        if (!p->task_id && jpath_compile("$.id", &p->task_id, &why) < 0) {
            errf(err, errlen, "%s: %s.id: %s", file, field, why ? why : "out of memory");
            return -1;
        }
        p->poll_interval_ms = get_long(fs, "interval_ms", 2000);
        p->poll_max_interval_ms = get_long(fs, "max_interval_ms", 30000);
        p->poll_deadline_ms = get_long(fs, "deadline_seconds", 3600) * 1000;
        if (p->poll_interval_ms < 10 || p->poll_max_interval_ms < p->poll_interval_ms ||
            p->poll_deadline_ms < 1000) {
            errf(err, errlen,
                 "%s: %s: need 10 <= interval_ms <= max_interval_ms, deadline_seconds >= 1", file,
                 field);
            return -1;
        }
        if (load_cancel(p, o, file, err, errlen) < 0)
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
        /* What the lookup proves is read in its body, never from its status alone: a 2xx is our
         * task only when it carries our reference (a filter the provider ignores answers its
         * newest task), a 404 is absence only when the provider itself says "no such task" (an
         * egress proxy's page, a renamed route, a gateway in front answer 404 too). */
        if (load_path(lk, "client_ref", &p->lookup_client_ref, 1, file, field, err, errlen) < 0)
            return -1;
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(lk, "absent");
        const char *eq = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ab, "equals"));
        snprintf(field, sizeof(field), "providers.%s.reconcile.lookup.absent", p->name);
        if (!cJSON_IsObject(ab) || !eq || !*eq) {
            errf(err, errlen,
                 "%s: %s: required, {\"path\": \"$.error.code\", \"equals\": \"not_found\"}: "
                 "what the provider's own 404 for no such task says",
                 file, field);
            return -1;
        }
        if (load_path(ab, "path", &p->lookup_absent, 1, file, field, err, errlen) < 0)
            return -1;
        p->lookup_absent_equals = strdup(eq);
        if (!p->lookup_absent_equals) {
            errf(err, errlen, "%s: %s: out of memory", file, field);
            return -1;
        }
    }
    if (p->reconcile == RECON_LIST_MATCH) {
        const cJSON *ls = cJSON_GetObjectItemCaseSensitive(rec, "list");
        snprintf(field, sizeof(field), "providers.%s.reconcile.list", p->name);
        if (load_template(ls, "path", &p->list_path, list_vars, file, field, err, errlen) < 0 ||
            load_path(ls, "items", &p->list_items, 1, file, field, err, errlen) < 0 ||
            load_path(ls, "match", &p->list_match, 1, file, field, err, errlen) < 0 ||
            load_path(ls, "id", &p->list_id, 0, file, field, err, errlen) < 0 ||
            load_path(ls, "next_cursor", &p->list_next_cursor, 0, file, field, err, errlen) < 0)
            return -1;
        /* The items are an array's elements: a page whose array is missing (an error envelope,
         * a renamed member) is not read as an empty page, which would prove absence. */
        const char *items = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ls, "items"));
        size_t il = strlen(items);
        char *arr = il >= 4 && !strcmp(items + il - 3, "[*]") ? strndup(items, il - 3) : NULL;
        const char *why = NULL;
        int ok = arr && jpath_compile(arr, &p->list_array, &why) == 0;
        free(arr);
        if (!ok) {
            errf(err, errlen, "%s: %s.items: the elements of an array, \"$.<path>[*]\"", file,
                 field);
            return -1;
        }
        /* A list read as one page when it is paginated proves absence from its first page. */
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(ls, "single_page");
        p->list_single_page = cJSON_IsTrue(single);
        if ((single && !cJSON_IsBool(single)) || (!p->list_next_cursor) == !p->list_single_page) {
            errf(err, errlen,
                 "%s: %s: either next_cursor (the list is paginated) or \"single_page\": true "
                 "(it never is)",
                 file, field);
            return -1;
        }
        p->list_cursor_param = dup_str(ls, "cursor_param", "cursor");
        p->list_max_pages = get_int(ls, "max_pages", 50);
        if (p->list_max_pages < 1 || p->list_max_pages > 10000 || !*p->list_cursor_param ||
            strspn(p->list_cursor_param, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789_-.[]") != strlen(p->list_cursor_param)) {
            errf(err, errlen, "%s: %s: max_pages in 1..10000, cursor_param a query name", file,
                 field);
            return -1;
        }
    }
    if ((p->reconcile == RECON_GET_BY_CLIENT_ID || p->reconcile == RECON_LIST_MATCH) &&
        !p->client_ref_header && !p->client_ref_body_field) {
        /* Without a reference sent with the create there is nothing to match on. */
        errf(err, errlen, "%s: providers.%s.reconcile.strategy %s needs client_ref", file,
             p->name, reconcile_names[p->reconcile]);
        return -1;
    }

    return 0;
}

static int load_semantics(struct cfg_provider *p, const cJSON *o, const char *file, char *err,
                          size_t errlen)
{
    char field[160];
    const cJSON *idem = cJSON_GetObjectItemCaseSensitive(o, "idempotency");
    p->idem_header = idem ? dup_str(idem, "header", NULL) : NULL;
    const cJSON *stream = cJSON_GetObjectItemCaseSensitive(o, "stream");
    int sf = stream ? sse_format_parse(cJSON_GetStringValue(stream)) : SSE_NONE;
    if (sf < 0) {
        errf(err, errlen,
             "%s: providers.%s.stream must be \"openai-chat\", \"anthropic\" or "
             "\"openai-responses\"",
             file, p->name);
        return -1;
    }
    p->stream_format = sf;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(o, "client_ref");
    p->client_ref_header = ref ? dup_str(ref, "header", NULL) : NULL;
    p->client_ref_body_field = ref ? dup_str(ref, "body_field", NULL) : NULL;
    if (load_retry(p, o, file, err, errlen) < 0 || load_reconcile(p, o, file, err, errlen) < 0 ||
        load_reconcile_reads(p, o, file, err, errlen) < 0)
        return -1;

    const cJSON *outs = cJSON_GetObjectItemCaseSensitive(o, "outputs");
    snprintf(field, sizeof(field), "providers.%s.outputs", p->name);
    if (load_path(outs, "requested", &p->outputs_requested, 0, file, field, err, errlen) < 0 ||
        load_path(outs, "received", &p->outputs_received, 0, file, field, err, errlen) < 0 ||
        load_path(outs, "usage", &p->usage, 0, file, field, err, errlen) < 0)
        return -1;
    p->outputs_default = get_int(outs, "default", 1);
    const cJSON *probe = cJSON_GetObjectItemCaseSensitive(o, "probe");
    p->probe_path = probe ? dup_str(probe, "path", NULL) : NULL;
    if (probe && (!p->probe_path || p->probe_path[0] != '/')) {
        errf(err, errlen, "%s: providers.%s.probe.path must start with /", file, p->name);
        return -1;
    }
    return 0;
}


static int load_extra_headers(struct cfg_provider *p, const cJSON *o, const char *file, char *err,
                              size_t errlen)
{
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "headers");
    int n = cJSON_GetArraySize(h);
    if (!h)
        return 0;
    if (!cJSON_IsObject(h)) {
        errf(err, errlen, "%s: providers.%s.headers must be an object of strings", file, p->name);
        return -1;
    }
    p->headers = calloc((size_t)n * 2 + 1, sizeof(char *));
    if (!p->headers)
        return -1;
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, h)
    {
        if (!cJSON_IsString(v) || strpbrk(v->valuestring, "\r\n") || strpbrk(v->string, "\r\n: ")) {
            errf(err, errlen, "%s: providers.%s.headers.%s must be a one-line string", file,
                 p->name, v->string);
            return -1;
        }
        p->headers[i++] = strdup(v->string);
        p->headers[i++] = strdup(v->valuestring);
    }
    return 0;
}

static int load_status_map(struct cfg_provider *p, const cJSON *map, const char *file, char *err,
                           size_t errlen)
{
    int n = cJSON_GetArraySize(map);
    if (!cJSON_IsObject(map) || n == 0) {
        errf(err, errlen, "%s: providers.%s.status.map must be a non-empty object", file, p->name);
        return -1;
    }
    p->status_map = calloc((size_t)n, sizeof(*p->status_map));
    if (!p->status_map)
        return -1;
    const cJSON *v;
    cJSON_ArrayForEach(v, map)
    {
        struct status_entry *e = &p->status_map[p->n_status_map++];
        e->from = strdup(v->string);
        int to = -1;
        for (int i = 0; i < TS__COUNT && cJSON_IsString(v); i++)
            if (strcmp(v->valuestring, status_names[i]) == 0)
                to = i;
        if (to < 0) {
            errf(err, errlen,
                 "%s: providers.%s.status.map.%s: target must be queued, running, succeeded, "
                 "failed or canceled",
                 file, p->name, v->string);
            return -1;
        }
        e->to = (enum task_status)to;
    }
    return 0;
}

int prof_map_status(const struct cfg_provider *p, const char *word)
{
    for (size_t i = 0; i < p->n_status_map; i++)
        if (strcmp(p->status_map[i].from, word) == 0)
            return (int)p->status_map[i].to;
    return -1;
}

int prof_counts_outputs(const struct cfg_provider *p)
{
    return p->outputs_received != NULL ||
           (p->mode == CFG_MODE_ASYNC_POLL && p->result_outputs && p->outputs_requested);
}

long prof_outputs_withheld(const struct cfg_provider *p, const cJSON *doc, int requested)
{
    const cJSON *n = p->result_filtered && doc ? jpath_first(p->result_filtered, doc) : NULL;
    if (!cJSON_IsNumber(n) || !(n->valuedouble >= 1 && n->valuedouble <= 1000000) ||
        n->valuedouble != (double)(long)n->valuedouble)
        return 0;
    if (p->result_outputs && jpath_each_list(p->result_outputs, doc, NULL, NULL) > 0)
        return 0;
    long withheld = (long)n->valuedouble;
    return requested > 0 && withheld < requested ? 0 : withheld;
}

int prof_task_status(const struct cfg_provider *p, int http_status, const cJSON *doc)
{
    if (p->status_by_http) {
        if (http_status == 200)
            return TS_SUCCEEDED;
        if (http_status == 202)
            return TS_RUNNING;
        /* Only a refusal about the task itself ends it; credentials, throttling, a conflict or
         * a "too early" and a task not visible yet are read again later (the statuses
         * prov_fetched_status and pol_cancel_answered read again too): a task that exists is
         * never written failed on a refusal that says nothing of it. */
        static const int later[] = {401, 403, 404, 408, 409, 425, 429};
        if (http_status < 400 || http_status >= 500)
            return -1;
        for (size_t i = 0; i < sizeof(later) / sizeof(later[0]); i++)
            if (http_status == later[i])
                return -1;
        return TS_FAILED;
    }
    if (!doc)
        return -1;
    if (p->status_path) {
        const char *word = jpath_string(p->status_path, doc);
        return word ? prof_map_status(p, word) : -1;
    }
    const cJSON *done = jpath_first(p->done_path, doc);
    if (!cJSON_IsTrue(done))
        return TS_RUNNING; /* absent or false: not done yet */
    const cJSON *err = p->error_present_path ? jpath_first(p->error_present_path, doc) : NULL;
    return err && !cJSON_IsNull(err) ? TS_FAILED : TS_SUCCEEDED;
}

/* "cancel": how a task followed by reads (an async task, or a synchronous create answered in
 * progress) is cancelled at the provider. */
static int load_cancel(struct cfg_provider *p, const cJSON *o, const char *file, char *err,
                       size_t errlen)
{
    char field[160];
    static const char *const vars[] = {"id", "client_ref", NULL};
    const cJSON *cancel = cJSON_GetObjectItemCaseSensitive(o, "cancel");
    if (!cancel)
        return 0;
    snprintf(field, sizeof(field), "providers.%s.cancel", p->name);
    const cJSON *deletes = cJSON_GetObjectItemCaseSensitive(cancel, "deletes");
    if (deletes && !cJSON_IsBool(deletes)) {
        errf(err, errlen, "%s: %s.deletes must be true or false", file, field);
        return -1;
    }
    p->cancel_deletes = cJSON_IsTrue(deletes);
    p->cancel_method = dup_str(cancel, "method", "POST");
    return load_template(cancel, "path", &p->cancel_path, vars, file, field, err, errlen);
}

/* create, poll, status, result and cancel of an async_poll provider. */
static int load_async(struct cfg_provider *p, const cJSON *o, const char *file, char *err,
                      size_t errlen)
{
    char field[160];
    static const char *const vars[] = {"id", "client_ref", NULL};
    const cJSON *create = cJSON_GetObjectItemCaseSensitive(o, "create");
    snprintf(field, sizeof(field), "providers.%s.create", p->name);
    if (load_path(create, "task_id", &p->task_id, 1, file, field, err, errlen) < 0 ||
        load_path(create, "poll_url", &p->poll_url, 0, file, field, err, errlen) < 0)
        return -1;
    const cJSON *acc = cJSON_GetObjectItemCaseSensitive(create, "accepted_statuses");
    const cJSON *st;
    cJSON_ArrayForEach(st, acc)
    {
        if (!cJSON_IsNumber(st) || st->valuedouble < 200 || st->valuedouble > 299 ||
            p->n_accepted_statuses == 8) {
            errf(err, errlen, "%s: %s.accepted_statuses: up to 8 statuses in 200..299", file,
                 field);
            return -1;
        }
        p->accepted_statuses[p->n_accepted_statuses++] = (int)st->valuedouble;
    }

    const cJSON *poll = cJSON_GetObjectItemCaseSensitive(o, "poll");
    snprintf(field, sizeof(field), "providers.%s.poll", p->name);
    p->poll_method = dup_str(poll, "method", "GET");
    if (strcmp(p->poll_method, "GET") && strcmp(p->poll_method, "POST")) {
        errf(err, errlen, "%s: %s.method must be GET or POST", file, field);
        return -1;
    }
    if (load_template(poll, "path", &p->poll_path, vars, file, field, err, errlen) < 0)
        return -1;
    const cJSON *body = cJSON_GetObjectItemCaseSensitive(poll, "body");
    if (body) {
        if (!cJSON_IsObject(body)) {
            errf(err, errlen, "%s: %s.body must be a JSON object", file, field);
            return -1;
        }
        p->poll_body = cJSON_PrintUnformatted(body);
    }
    p->poll_interval_ms = get_long(poll, "interval_ms", 2000);
    p->poll_max_interval_ms = get_long(poll, "max_interval_ms", 30000);
    p->poll_deadline_ms = get_long(poll, "deadline_seconds", 3600) * 1000;
    p->poll_hint_header = dup_str(poll, "hint_header", NULL);
    if (p->poll_interval_ms < 10 || p->poll_max_interval_ms < p->poll_interval_ms ||
        p->poll_deadline_ms < 1000) {
        errf(err, errlen, "%s: %s: need 10 <= interval_ms <= max_interval_ms, deadline_seconds >= 1",
             file, field);
        return -1;
    }

    const cJSON *status = cJSON_GetObjectItemCaseSensitive(o, "status");
    snprintf(field, sizeof(field), "providers.%s.status", p->name);
    p->status_by_http = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(status, "by_http_status"));
    if (load_path(status, "path", &p->status_path, 0, file, field, err, errlen) < 0 ||
        load_path(status, "done", &p->done_path, 0, file, field, err, errlen) < 0 ||
        load_path(status, "error", &p->error_present_path, 0, file, field, err, errlen) < 0)
        return -1;
    if (p->status_path &&
        load_status_map(p, cJSON_GetObjectItemCaseSensitive(status, "map"), file, err, errlen) < 0)
        return -1;
    if (!p->status_path && !p->done_path && !p->status_by_http) {
        errf(err, errlen, "%s: %s needs \"path\" and \"map\", \"done\", or \"by_http_status\"",
             file, field);
        return -1;
    }

    const cJSON *result = cJSON_GetObjectItemCaseSensitive(o, "result");
    snprintf(field, sizeof(field), "providers.%s.result", p->name);
    p->result_kind = dup_str(result, "kind", "url");
    if (strcmp(p->result_kind, "url") && strcmp(p->result_kind, "b64") &&
        strcmp(p->result_kind, "binary_endpoint")) {
        errf(err, errlen, "%s: %s.kind must be url, b64 or binary_endpoint", file, field);
        return -1;
    }
    if (cJSON_GetObjectItemCaseSensitive(result, "fetch_path") &&
        load_template(result, "fetch_path", &p->result_fetch_path, vars, file, field, err,
                      errlen) < 0)
        return -1;
    if (cJSON_GetObjectItemCaseSensitive(result, "content_path") &&
        load_template(result, "content_path", &p->result_content_path, vars, file, field, err,
                      errlen) < 0)
        return -1;
    if (!strcmp(p->result_kind, "binary_endpoint") && !p->result_content_path) {
        errf(err, errlen, "%s: %s.content_path is required for kind binary_endpoint", file, field);
        return -1;
    }
    if (load_path(result, "fetch_url", &p->result_fetch_url, 0, file, field, err, errlen) < 0 ||
        load_path(result, "outputs", &p->result_outputs, 0, file, field, err, errlen) < 0 ||
        load_path(result, "output_url", &p->result_output_url, 0, file, field, err, errlen) < 0 ||
        load_path(result, "expires_at", &p->result_expires_at, 0, file, field, err, errlen) < 0 ||
        load_path(result, "error", &p->result_error, 0, file, field, err, errlen) < 0 ||
        load_path(result, "filtered", &p->result_filtered, 0, file, field, err, errlen) < 0)
        return -1;
    p->result_url_ttl_s = get_long(result, "url_ttl_seconds", 3600);
    p->result_fetch_strip = dup_str(result, "fetch_from_poll_url_strip", NULL);

    return load_cancel(p, o, file, err, errlen);
}

static int load_webhook(struct cfg_provider *p, const cJSON *o, const char *file, char *err,
                        size_t errlen)
{
    char field[160];
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(o, "webhook");
    if (!w)
        return 0;
    snprintf(field, sizeof(field), "providers.%s.webhook", p->name);
    p->webhook_body_field = dup_str(w, "body_field", NULL);
    p->webhook_url_query = dup_str(w, "url_query", NULL);
    p->webhook_secret_env = dup_str(w, "secret_env", NULL);
    p->webhook_signature_header = dup_str(w, "signature_header", NULL);
    p->webhook_window_hours = get_long(w, "redelivery_window_hours", 72);
    /* Indexed by enum webhook_verify; a verify that is not a string means "none". */
    static const char *const schemes[] = {"none", "standard_webhooks", "hmac_sha256_hex",
                                          "ed25519"};
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(w, "verify");
    const char *verify = cJSON_IsString(v) ? v->valuestring : "none";
    int scheme = -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(verify, schemes[i]) == 0)
            scheme = i;
    if (scheme < 0) {
        errf(err, errlen,
             "%s: %s.verify must be standard_webhooks, hmac_sha256_hex, ed25519 or none", file,
             field);
        return -1;
    }
    p->webhook_verify = (enum webhook_verify)scheme;
    if (p->webhook_verify != WHV_NONE && !p->webhook_secret_env) {
        errf(err, errlen, "%s: %s.secret_env is required with verify %s", file, field, verify);
        return -1;
    }
    const char *eid = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(w, "event_id"));
    if (eid && strncmp(eid, "header:", 7) == 0)
        p->webhook_event_id_header = strdup(eid + 7);
    else if (load_path(w, "event_id", &p->webhook_event_id, 0, file, field, err, errlen) < 0)
        return -1;
    if (load_path(w, "client_ref", &p->webhook_client_ref, 0, file, field, err, errlen) < 0)
        return -1;
    if (load_path(w, "task_id", &p->webhook_task_id, 1, file, field, err, errlen) < 0)
        return -1;
    return 0;
}

/* The path of profile file name: as it is when absolute, else relative to dir. */
static void profile_file(const char *dir, const char *name, char *path, size_t len)
{
    if (name[0] == '/')
        snprintf(path, len, "%s", name);
    else
        snprintf(path, len, "%s/%s", dir, name);
}

/* Reads the profile file at path into a new cJSON object, refusing a member no provider has. */
static cJSON *read_profile(const char *path, const char *file, size_t index, char *err,
                           size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        errf(err, errlen, "%s: profile %s: cannot read: %s", file, path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (!buf)
        return NULL;
    buf[n] = '\0';
    cJSON *o = cJSON_ParseWithLength(buf, n);
    free(buf);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        errf(err, errlen, "%s: not a JSON object", path);
        return NULL;
    }
    struct memb_problem mp;
    if (memb_check(o, &profile_t, "", &mp) < 0) {
        char msg[400];
        memb_message(&mp, msg, sizeof(msg));
        errf(err, errlen, "%s: %s, in the profile of providers[%zu] of %s", path, msg, index,
             file);
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* The profile's members, overridden by the entry's own (one level: an entry's "poll" replaces
 * the profile's "poll" whole). index is the entry's place in the providers array. Returns a new
 * object. */
static cJSON *merged(const cJSON *entry, size_t index, const char *dir, const char *file,
                     char **profile_id, char *err, size_t errlen)
{
    const char *pname = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(entry, "profile"));
    char path[2048] = "";
    if (pname)
        profile_file(dir, pname, path, sizeof(path));
    cJSON *m = pname ? read_profile(path, file, index, err, errlen) : cJSON_CreateObject();
    if (!m)
        return NULL;
    const cJSON *v;
    cJSON_ArrayForEach(v, entry)
    {
        cJSON_DeleteItemFromObjectCaseSensitive(m, v->string);
        cJSON_AddItemToObject(m, v->string, cJSON_Duplicate(v, 1));
    }
    const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "id"));
    *profile_id = strdup(id ? id : pname ? pname : "inline");
    return m;
}

/* profile_stamp (profile.h) of a merged provider object; NULL when out of memory. */
static char *stamp_of(const char *profile_id, const cJSON *m)
{
    const cJSON *rec = cJSON_GetObjectItemCaseSensitive(m, "reconcile");
    /* Where the reference goes, how a search reads it, and where the search and the resend
     * go (the host; a header naming the account or project). */
    const cJSON *parts[] = {cJSON_GetObjectItemCaseSensitive(m, "client_ref"),
                            cJSON_GetObjectItemCaseSensitive(rec, "strategy"),
                            cJSON_GetObjectItemCaseSensitive(rec, "list"),
                            cJSON_GetObjectItemCaseSensitive(rec, "lookup"),
                            cJSON_GetObjectItemCaseSensitive(m, "base_url"),
                            cJSON_GetObjectItemCaseSensitive(m, "headers")};
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    /* Each part in its canonical form (RFC 8785, jcs.h): the order of a profile's members
     * changes nothing; a value cJSON cannot print exactly (a number past 2^53) is not there. */
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        char *one = parts[i] ? cJSON_PrintUnformatted(parts[i]) : NULL, *canon = NULL;
        size_t clen = 0;
        if (one && jcs_canonicalize(one, strlen(one), 64, &canon, &clen, NULL) != 0)
            canon = NULL;
        fprintf(f, "%s\n", canon ? canon : one ? one : "-");
        free(canon);
        cJSON_free(one);
    }
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    char hex[CRYPTO_SHA256_HEX], *stamp = NULL;
    crypto_sha256_hex(text, len, hex);
    free(text);
    if (asprintf(&stamp, "%s#%.12s", profile_id, hex) < 0)
        return NULL;
    return stamp;
}

static int load_one(struct cfg_provider *p, const cJSON *o, const char *file, char *err,
                    size_t errlen)
{
    p->base_url = dup_str(o, "base_url", NULL);
    /* A host must follow the scheme: "http://" alone would become "http:/" below. */
    size_t scheme = !p->base_url                               ? 0
                    : strncmp(p->base_url, "http://", 7) == 0  ? 7
                    : strncmp(p->base_url, "https://", 8) == 0 ? 8
                                                               : 0;
    if (!scheme || p->base_url[scheme] == '\0' || p->base_url[scheme] == '/') {
        errf(err, errlen, "%s: providers.%s.base_url must be an http(s) URL", file, p->name);
        return -1;
    }
    /* Paths are appended with their own '/': every trailing one goes. */
    size_t bl = strlen(p->base_url);
    while (bl > scheme && p->base_url[bl - 1] == '/')
        p->base_url[--bl] = '\0';
    const char *mode = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "mode"));
    if (mode && strcmp(mode, "sync") != 0 && strcmp(mode, "async_poll") != 0) {
        errf(err, errlen, "%s: providers.%s.mode must be sync or async_poll", file, p->name);
        return -1;
    }
    p->mode = mode && strcmp(mode, "async_poll") == 0 ? CFG_MODE_ASYNC_POLL : CFG_MODE_SYNC;
    const cJSON *auth = cJSON_GetObjectItemCaseSensitive(o, "auth");
    static const int trip_default[] = {401, 402, 403};
    char field[160];
    snprintf(field, sizeof(field), "providers.%s.auth", p->name);
    if (load_statuses(auth, "trip_statuses", p->trip_statuses, 8, &p->n_trip_statuses,
                      trip_default, 3, 400, 499, file, field, err, errlen) < 0 ||
        load_trip_markers(p, auth, file, err, errlen) < 0)
        return -1;
    if (auth) {
        p->auth_header = dup_str(auth, "header", "Authorization");
        p->auth_prefix = dup_str(auth, "prefix", "");
        if (load_credential(p, auth, file, err, errlen) < 0)
            return -1;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "timeouts");
    p->connect_timeout_ms = get_long(t, "connect_ms", 5000);
    p->total_timeout_ms = get_long(t, "total_ms", 30000);
    if (p->connect_timeout_ms < 1 || p->total_timeout_ms < p->connect_timeout_ms) {
        errf(err, errlen, "%s: providers.%s.timeouts: need 1 <= connect_ms <= total_ms", file,
             p->name);
        return -1;
    }
    /* A create's own limit, up to a day: past the lease it is renewed while the call runs. */
    p->create_timeout_ms = get_long(t, "create_total_ms", p->total_timeout_ms);
    if (p->create_timeout_ms < p->total_timeout_ms || p->create_timeout_ms > 86400000L) {
        errf(err, errlen,
             "%s: providers.%s.timeouts: need total_ms <= create_total_ms <= 86400000", file,
             p->name);
        return -1;
    }
    /* Below the provider's own idle timeout (nginx 75 s, most load balancers 60 s, Node.js 5 s,
     * gunicorn 2 s): a connection the provider closes just as a call reuses it costs that call
     * an ambiguous outcome (upstream.h). */
    p->keepalive_seconds = get_long(t, "keepalive_seconds", 2);
    if (p->keepalive_seconds < 0 || p->keepalive_seconds > 3600) {
        errf(err, errlen, "%s: providers.%s.timeouts.keepalive_seconds: 0..3600", file, p->name);
        return -1;
    }
    /* At most 384 MiB: PostgreSQL holds at most 1 GB in one field, and a result is read back in
     * text form (hex: twice its length), so one over ~511 MiB, though written, could never be
     * served; one over 1 GB could never be written — a paid result left to the reaper. */
    double cap = get_long(o, "max_response_bytes", 256L * 1024 * 1024);
    if (cap < 1024 || cap > 384.0 * 1024 * 1024) {
        errf(err, errlen, "%s: providers.%s.max_response_bytes: 1024..402653184 (384 MiB)", file,
             p->name);
        return -1;
    }
    p->max_response_bytes = (size_t)cap;
    long inflight = get_long(o, "max_inflight_calls", 0);
    if (inflight < 0 || inflight > 1000000) {
        errf(err, errlen, "%s: providers.%s.max_inflight_calls: 0..1000000 (0: only the "
             "replica's max_inflight_calls)", file, p->name);
        return -1;
    }
    p->max_inflight_calls = (int)inflight;
    p->proxy = dup_str(o, "proxy", NULL);
    if (p->proxy && strncmp(p->proxy, "http://", 7) && strncmp(p->proxy, "https://", 8) &&
        strncmp(p->proxy, "socks5h://", 10)) {
        errf(err, errlen, "%s: providers.%s.proxy must be an http(s):// or socks5h:// URL", file,
             p->name);
        return -1;
    }
    /* Through an https:// proxy a kept-alive connection is never reused: its answer's last bytes
     * may leave the proxy's TLS session holding more (an answer nobody asked for, read with
     * them), which neither a peek of the socket nor the provider's own session shows, and which
     * libcurl 7.88 shows only for an http:// provider (connguard.h). Every call then has a
     * connection of its own. */
    if (p->proxy && !strncmp(p->proxy, "https://", 8))
        p->keepalive_seconds = 0;
    /* The certificates that authenticate the provider's own origin (a private CA), instead of
     * the system's (bundle and directory); read by libcurl at each new connection, so it must
     * stay readable. */
    const cJSON *ca = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "tls"),
                                                       "ca_file");
    p->ca_file = cJSON_IsString(ca) ? strdup(ca->valuestring) : NULL;
    if (ca && (!p->ca_file || p->ca_file[0] != '/' || access(p->ca_file, R_OK) != 0)) {
        errf(err, errlen, "%s: providers.%s.tls.ca_file must be an absolute path to a readable "
             "PEM file", file, p->name);
        return -1;
    }
    if (load_routes(p, cJSON_GetObjectItemCaseSensitive(o, "routes"), file, err, errlen) < 0)
        return -1;
    if (load_semantics(p, o, file, err, errlen) < 0 || load_extra_headers(p, o, file, err, errlen) < 0)
        return -1;
    if (p->mode == CFG_MODE_ASYNC_POLL && load_async(p, o, file, err, errlen) < 0)
        return -1;
    if (load_webhook(p, o, file, err, errlen) < 0)
        return -1;
    char perr[200] = "";
    if (price_table_load(cJSON_GetObjectItemCaseSensitive(o, "pricing"), &p->pricing, perr,
                         sizeof(perr)) < 0) {
        errf(err, errlen, "%s: providers.%s.%s", file, p->name, perr);
        return -1;
    }
    return archprof_new(cJSON_GetObjectItemCaseSensitive(o, "archive"), file, p->name,
                        &p->archive, err, errlen);
}

int prof_load_all(const cJSON *arr, const char *file, const char *dir,
                  struct cfg_provider **out, size_t *count, char *err, size_t errlen)
{
    int n = cJSON_GetArraySize(arr);
    if (!cJSON_IsArray(arr)) {
        errf(err, errlen, "%s: providers must be an array", file);
        return -1;
    }
    struct cfg_provider *ps = calloc((size_t)n + 1, sizeof(*ps));
    if (!ps)
        return -1;
    *out = ps;
    *count = 0;
    const cJSON *entry;
    cJSON_ArrayForEach(entry, arr)
    {
        struct cfg_provider *p = &ps[(*count)++];
        /* Members first: a misspelt "name" is reported as such, not as a missing name. */
        char at[48];
        struct memb_problem mp;
        snprintf(at, sizeof(at), "providers[%zu]", *count - 1);
        if (memb_check(entry, &prof_entry_members, at, &mp) < 0) {
            char msg[400];
            memb_message(&mp, msg, sizeof(msg));
            errf(err, errlen, "%s: %s", file, msg);
            return -1;
        }
        p->name = dup_str(entry, "name", NULL);
        if (!p->name || !*p->name || strspn(p->name, "abcdefghijklmnopqrstuvwxyz0123456789-_") !=
                                         strlen(p->name)) {
            errf(err, errlen, "%s: providers[%zu].name must be [a-z0-9_-]+", file, *count - 1);
            return -1;
        }
        for (size_t i = 0; i + 1 < *count; i++) {
            if (strcmp(ps[i].name, p->name) == 0) {
                errf(err, errlen, "%s: providers.%s is declared twice", file, p->name);
                return -1;
            }
        }
        cJSON *m = merged(entry, *count - 1, dir, file, &p->profile_id, err, errlen);
        if (!m)
            return -1;
        if (!p->profile_id || !(p->profile_stamp = stamp_of(p->profile_id, m))) {
            cJSON_Delete(m);
            errf(err, errlen, "%s: providers.%s: out of memory", file, p->name);
            return -1;
        }
        /* Errors name the profile file too: that is where most fields are written. */
        char where[2048];
        const char *pf = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(entry, "profile"));
        if (pf)
            snprintf(where, sizeof(where), "%s (profile %s%s%s)", file, pf[0] == '/' ? "" : dir,
                     pf[0] == '/' ? "" : "/", pf);
        else
            snprintf(where, sizeof(where), "%s", file);
        int rc = load_one(p, m, where, err, errlen);
        cJSON_Delete(m);
        if (rc < 0)
            return -1;
    }
    return 0;
}

void prof_free_all(struct cfg_provider *ps, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct cfg_provider *p = &ps[i];
        for (size_t j = 0; j < p->n_routes; j++) {
            free(p->routes[j].route);
            free(p->routes[j].method);
            free(p->routes[j].path);
        }
        free(p->routes);
        char *strs[] = {p->name, p->base_url, p->auth_header, p->auth_prefix, p->credential,
                        p->idem_header, p->client_ref_header, p->client_ref_body_field,
                        p->lookup_path, p->list_path, p->probe_path, p->profile_id,
                        p->profile_stamp,
                        p->poll_method, p->poll_path, p->poll_body, p->poll_hint_header,
                        p->result_fetch_path, p->result_kind, p->result_content_path,
                        p->cancel_method, p->cancel_path, p->webhook_body_field,
                        p->webhook_secret_env, p->webhook_signature_header,
                        p->webhook_event_id_header, p->webhook_url_query,
                        p->result_fetch_strip, p->proxy, p->ca_file, p->list_cursor_param,
                        p->task_path, p->resume_query, p->resume_start_query,
                        p->lookup_absent_equals};
        for (size_t k = 0; k < sizeof(strs) / sizeof(strs[0]); k++)
            free(strs[k]);
        for (int k = 0; k < p->n_trip_markers; k++)
            free(p->trip_markers[k]);
        struct jpath *paths[] = {p->lookup_id, p->lookup_client_ref, p->lookup_absent,
                                 p->list_items, p->list_array, p->list_match,
                                 p->list_id,
                                 p->outputs_requested, p->outputs_received, p->usage, p->task_id,
                                 p->poll_url, p->status_path, p->done_path,
                                 p->error_present_path, p->result_fetch_url, p->result_outputs,
                                 p->result_output_url, p->result_expires_at, p->result_error,
                                 p->result_filtered,
                                 p->webhook_event_id, p->webhook_task_id,
                                 p->list_next_cursor, p->task_client_ref,
                                 p->webhook_client_ref, p->found_result, p->resume_when,
                                 p->resume_sequence};
        for (size_t k = 0; k < sizeof(paths) / sizeof(paths[0]); k++)
            jpath_free(paths[k]);
        price_table_fini(&p->pricing);
        for (size_t k = 0; p->headers && p->headers[k]; k++)
            free(p->headers[k]);
        free(p->headers);
        for (size_t k = 0; k < p->n_status_map; k++)
            free(p->status_map[k].from);
        free(p->status_map);
        bo_body_hint_free(&p->body_hint);
        archprof_free(p->archive);
    }
    free(ps);
}
