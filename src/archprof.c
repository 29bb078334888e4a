#include "idemgate/archprof.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The members archprof_new reads (members.h). */
static const struct memb archive_m[] = {
    {"allow_http", MEMB_VALUE, NULL}, {"allow_private", MEMB_VALUE, NULL},
    {"b64", MEMB_VALUE, NULL},        {"content_type", MEMB_VALUE, NULL},
    {"hosts", MEMB_VALUE, NULL},      {"max_bytes", MEMB_VALUE, NULL},
    {"timeout_ms", MEMB_VALUE, NULL}, {"url", MEMB_VALUE, NULL},
};
const struct memb_table archprof_members = MEMB_TABLE(archive_m, NULL);

#define DEFAULT_MAX_BYTES (1LL << 30)
#define DEFAULT_TIMEOUT_MS 300000L

static void errf(char *err, size_t errlen, const char *fmt, const char *file, const char *name,
                 const char *what)
{
    snprintf(err, errlen, fmt, file, name, what);
}

static int path_or_default(const cJSON *a, const char *key, const char *def, struct jpath **out,
                           const char *file, const char *name, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(a, key);
    const char *src = cJSON_IsString(v) ? v->valuestring : def;
    const char *why = NULL;
    *out = NULL;
    if (v && !cJSON_IsString(v)) {
        errf(err, errlen, "%s: providers.%s.archive.%s: must be a JSONPath string", file, name,
             key);
        return -1;
    }
    if (src && jpath_compile(src, out, &why) < 0) {
        errf(err, errlen, "%s: providers.%s.archive.%s: not a JSONPath", file, name, key);
        return -1;
    }
    return 0;
}

/* hosts: an array of host names ("cdn.example", or ".example.com" for a domain's hosts). */
static int load_hosts(const cJSON *a, struct arch_profile *ap, const char *file, const char *name,
                      char *err, size_t errlen)
{
    const cJSON *hosts = cJSON_GetObjectItemCaseSensitive(a, "hosts");
    if (hosts && !cJSON_IsArray(hosts)) {
        errf(err, errlen, "%s: providers.%s.archive.%s must be an array of host names", file, name,
             "hosts");
        return -1;
    }
    int nh = cJSON_GetArraySize(hosts);
    ap->hosts = calloc((size_t)nh + 1, sizeof(char *));
    if (!ap->hosts)
        return -1;
    const cJSON *h;
    cJSON_ArrayForEach(h, hosts)
    {
        if (!cJSON_IsString(h) || !*h->valuestring || strchr(h->valuestring, '/') ||
            strchr(h->valuestring, ':')) {
            errf(err, errlen,
                 "%s: providers.%s.archive.%s: each a host name (cdn.example or "
                 ".example.com)",
                 file, name, "hosts");
            return -1;
        }
        if (!(ap->hosts[ap->n_hosts] = strdup(h->valuestring)))
            return -1;
        ap->n_hosts++;
    }
    return 0;
}

/* The flags and bounds: allow_http, allow_private, max_bytes, timeout_ms. */
static int load_limits(const cJSON *a, struct arch_profile *ap, const char *file, const char *name,
                       char *err, size_t errlen)
{
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(a, "allow_http")))
        ap->allow_http = cJSON_IsTrue(v);
    if ((v = cJSON_GetObjectItemCaseSensitive(a, "allow_private")))
        ap->allow_private = cJSON_IsTrue(v);
    if ((v = cJSON_GetObjectItemCaseSensitive(a, "max_bytes"))) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1e12) {
            errf(err, errlen, "%s: providers.%s.archive.%s: 1..1000000000000", file, name,
                 "max_bytes");
            return -1;
        }
        ap->max_bytes = (long long)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(a, "timeout_ms"))) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 100 || v->valuedouble > 86400000) {
            errf(err, errlen, "%s: providers.%s.archive.%s: 100..86400000", file, name,
                 "timeout_ms");
            return -1;
        }
        ap->timeout_ms = (long)v->valuedouble;
    }
    return 0;
}

int archprof_new(const cJSON *a, const char *file, const char *provider, struct arch_profile **out,
                 char *err, size_t errlen)
{
    struct arch_profile *ap = calloc(1, sizeof(*ap));
    *out = NULL;
    if (!ap)
        return -1;
    ap->max_bytes = DEFAULT_MAX_BYTES;
    ap->timeout_ms = DEFAULT_TIMEOUT_MS;
    if (a && !cJSON_IsObject(a)) {
        errf(err, errlen, "%s: providers.%s.%s must be an object", file, provider, "archive");
        goto failed;
    }
    if (load_hosts(a, ap, file, provider, err, errlen) < 0 ||
        load_limits(a, ap, file, provider, err, errlen) < 0 ||
        path_or_default(a, "url", NULL, &ap->url, file, provider, err, errlen) < 0 ||
        path_or_default(a, "b64", "$.b64_json", &ap->b64, file, provider, err, errlen) < 0 ||
        path_or_default(a, "content_type", NULL, &ap->content_type, file, provider, err, errlen) <
            0)
        goto failed;
    *out = ap;
    return 0;
failed:
    archprof_free(ap);
    return -1;
}

void archprof_free(struct arch_profile *ap)
{
    if (!ap)
        return;
    for (size_t i = 0; i < ap->n_hosts; i++)
        free(ap->hosts[i]);
    free(ap->hosts);
    jpath_free(ap->url);
    jpath_free(ap->b64);
    jpath_free(ap->content_type);
    free(ap);
}

struct fp_policy archprof_policy(const struct arch_profile *ap)
{
    struct fp_policy pol = {NULL, 0, 0};
    if (ap) {
        pol.hosts = (const char *const *)ap->hosts;
        pol.n_hosts = ap->n_hosts;
        pol.allow_http = ap->allow_http;
    }
    return pol;
}
