#include "idemgate/provider.h"

#include "idemgate/log.h"
#include "idemgate/secrets.h"
#include "idemgate/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HEADERS 32

int prov_secret_ok(const char *secret)
{
    for (const unsigned char *s = (const unsigned char *)secret; s && *s; s++)
        if (*s < 0x20 || *s == 0x7f)
            return 0;
    return 1;
}

/* The answer of a call that never left: nothing was sent, so nothing can have been made (a
 * secret read at the send may be gone since the check before it: a file an agent replaces). */
static void not_sent(struct up_response *res, const char *why)
{
    memset(res, 0, sizeof(*res));
    res->aborted_before_send = 1;
    snprintf(res->error, sizeof(res->error), "%s", why);
}

int prov_xfer_new(const struct cfg_provider *p, const struct prov_call *c, struct up_xfer **out,
                  struct up_response *res)
{
    const char *hdrs[2 * MAX_HEADERS + 1] = {NULL};
    char *auth = NULL;
    size_t auth_len = 0;
    int h = 0, rc;
    *out = NULL;
    char *secret = c->credential && *c->credential ? secret_get(c->credential) : NULL;
    if (c->credential && *c->credential && !secret) {
        not_sent(res, "the provider's credential is not set (its variable unset, its file "
                      "unreadable)");
        return -1;
    }
    if (secret && !prov_secret_ok(secret)) { /* never sent: nothing of it is said */
        secret_free(secret);
        not_sent(res, "the provider's credential holds a control character (a line end?)");
        return -1;
    }
    if (secret) {
        /* Exactly as long as it needs to be: a 2 KB token is not cut (it would read as 401). */
        const char *prefix = p->auth_prefix ? p->auth_prefix : "";
        auth_len = strlen(prefix) + strlen(secret) + 1;
        auth = malloc(auth_len);
        if (!auth) {
            secret_free(secret);
            not_sent(res, "out of memory");
            return -1;
        }
        snprintf(auth, auth_len, "%s%s", prefix, secret);
        secret_free(secret);
    }
    for (const char *const *x = c->headers; x && x[0] && x[1] && h < 2 * MAX_HEADERS - 2; x += 2) {
        hdrs[h++] = x[0];
        hdrs[h++] = x[1];
    }
    for (size_t i = 0; p->headers && p->headers[i] && h < 2 * MAX_HEADERS - 2; i += 2) {
        hdrs[h++] = p->headers[i];
        hdrs[h++] = p->headers[i + 1];
    }
    struct up_request req = {.method = c->method,
                             .url = c->url,
                             .auth_header = auth ? p->auth_header : NULL,
                             .auth_value = auth,
                             .headers = hdrs,
                             .body = c->body,
                             .body_len = c->body ? c->body_len : 0,
                             .connect_timeout_ms = p->connect_timeout_ms,
                             .total_timeout_ms = c->lease_kept ? p->create_timeout_ms
                                                 : c->total_timeout_ms > 0 &&
                                                         c->total_timeout_ms < p->total_timeout_ms
                                                     ? c->total_timeout_ms
                                                     : p->total_timeout_ms,
                             .keepalive_seconds = p->keepalive_seconds,
                             .max_response_bytes = p->max_response_bytes,
                             .proxy = p->proxy,
                             .ca_file = p->ca_file,
                             .before_send = c->before_send,
                             .before_send_arg = c->before_send_arg,
                             .on_stream = c->on_stream,
                             .on_stream_arg = c->on_stream_arg,
                             .stream_kept = c->stream_kept};
    /* The header lines, the credential's among them, are copied into the transfer (and zeroed
     * when it is freed); our buffer is zeroed now. */
    rc = up_xfer_new(&req, out, res);
    if (auth) {
        explicit_bzero(auth, auth_len);
        free(auth);
    }
    return rc;
}

void prov_submit(struct eng *e, int slot, const struct cfg_provider *p, const struct prov_call *c,
                 eng_done_fn done, void *arg)
{
    struct up_xfer *x;
    struct up_response res;
    if (!c->url || prov_xfer_new(p, c, &x, &res) < 0) {
        if (!c->url) {
            memset(&res, 0, sizeof(res));
            snprintf(res.error, sizeof(res.error), "no URL to call");
        }
        eng_release(e, slot);
        done(arg, &res);
        return;
    }
    eng_submit(e, slot, x, done, arg);
}

int prov_call(const struct cfg_provider *p, const struct prov_call *c, struct up_response *res)
{
    struct up_xfer *x;
    if (prov_xfer_new(p, c, &x, res) < 0)
        return -1;
    return up_xfer_perform(x, res);
}

char *prov_url(const struct cfg_provider *p, const char *tmpl, tmpl_lookup_fn lookup, void *arg,
               const char *what)
{
    char err[128], *path = NULL;
    if (tmpl_expand(tmpl, TMPL_URL_SEGMENT, lookup, arg, &path, err, sizeof(err)) < 0) {
        LOG(LOG_ERROR, "provider_url", LS("provider", p->name), LS("what", what),
            LS("error", err));
        return NULL;
    }
    size_t n = strlen(p->base_url) + strlen(path) + 1;
    char *url = malloc(n);
    if (url)
        snprintf(url, n, "%s%s", p->base_url, path);
    free(path);
    return url;
}

int prov_same_origin(const char *url, const char *base)
{
    /* scheme://host[:port] of base, then '/', '?' or the end. */
    const char *p = strstr(base, "://");
    if (!p)
        return 0;
    const char *end = strchr(p + 3, '/');
    size_t n = end ? (size_t)(end - base) : strlen(base);
    return strncmp(url, base, n) == 0 && (url[n] == '/' || url[n] == '\0' || url[n] == '?');
}

struct task_vars {
    const char *id, *client_ref;
};

static const char *task_var(const char *name, size_t len, void *arg)
{
    const struct task_vars *v = arg;
    if (len == 2 && memcmp(name, "id", 2) == 0)
        return v->id;
    if (len == 10 && memcmp(name, "client_ref", 10) == 0)
        return v->client_ref;
    return NULL;
}

char *prov_task_url(const struct cfg_provider *p, const char *remote_id, const char *client_ref)
{
    const char *tmpl = p->task_path                     ? p->task_path
                       : p->mode == CFG_MODE_ASYNC_POLL ? p->poll_path
                                                        : NULL;
    struct task_vars v = {remote_id, client_ref};
    return tmpl ? prov_url(p, tmpl, task_var, &v, "task") : NULL;
}

static const char *after_var(const char *name, size_t len, void *arg)
{
    return len == 5 && memcmp(name, "after", 5) == 0 ? arg : NULL;
}

char *prov_resume_url(const struct cfg_provider *p, const char *remote_id, long long after)
{
    char num[24], err[160], *query = NULL, *url = NULL;
    snprintf(num, sizeof(num), "%lld", after);
    const char *tmpl = after < 0 ? p->resume_start_query : p->resume_query;
    char *task = tmpl ? prov_task_url(p, remote_id, NULL) : NULL;
    if (task && tmpl_expand(tmpl, TMPL_URL_SEGMENT, after_var, num, &query, err, sizeof(err)) == 0 &&
        asprintf(&url, "%s%c%s", task, strchr(task, '?') ? '&' : '?', query) < 0)
        url = NULL;
    free(query);
    free(task);
    return url;
}

int prov_task_answered(const struct up_response *res)
{
    return res->curl_code == 0 && res->http_status >= 200 && res->http_status < 300 &&
           !res->body_truncated;
}

int prov_fetched_status(const struct cfg_provider *p, const struct up_response *r)
{
    if (r->curl_code || r->http_status <= 0 || r->body_truncated)
        return -1;
    if (r->http_status >= 200 && r->http_status < 300)
        return TS_SUCCEEDED;
    static const int later[] = {401, 403, 404, 408, 409, 425, 429};
    if (r->http_status < 400 || r->http_status >= 500 || !p->result_error)
        return -1;
    for (size_t i = 0; i < sizeof(later) / sizeof(later[0]); i++)
        if (r->http_status == later[i])
            return -1;
    cJSON *doc = r->body ? cJSON_ParseWithLength(r->body, r->body_len) : NULL;
    int failed = doc && jpath_first(p->result_error, doc) != NULL;
    cJSON_Delete(doc);
    return failed ? TS_FAILED : -1;
}

int prov_read_task(const struct cfg_provider *p, const char *credential, const char *remote_id,
                   const char *client_ref, struct up_response *res)
{
    char *url = prov_task_url(p, remote_id, client_ref);
    memset(res, 0, sizeof(*res));
    struct prov_call call = {.method = "GET", .url = url, .credential = credential};
    int ok = url && prov_call(p, &call, res) == 0 && prov_task_answered(res);
    free(url);
    return ok ? 0 : -1;
}

int prov_task_is(const struct cfg_provider *p, const struct up_response *res,
                 const char *client_ref)
{
    if (!p->task_client_ref || !res->body)
        return 0;
    cJSON *doc = cJSON_ParseWithLength(res->body, res->body_len);
    const char *ref = doc ? jpath_string(p->task_client_ref, doc) : NULL;
    int ok = ref && strcmp(ref, client_ref) == 0;
    cJSON_Delete(doc);
    return ok;
}

char *prov_query_escape(const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    char *out = malloc(strlen(s) * 3 + 1);
    size_t o = 0;
    if (!out)
        return NULL;
    for (const unsigned char *q = (const unsigned char *)s; *q; q++) {
        if ((*q >= 'A' && *q <= 'Z') || (*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9') ||
            *q == '-' || *q == '.' || *q == '_' || *q == '~') {
            out[o++] = (char)*q;
        } else {
            out[o++] = '%';
            out[o++] = hex[*q >> 4];
            out[o++] = hex[*q & 15];
        }
    }
    out[o] = '\0';
    return out;
}

/* Copies body, putting quotes around every integer token outside strings. */
static char *quote_integers(const char *s, size_t len)
{
    char *out = malloc(len * 3 + 1); /* at worst every byte a one-digit integer: "1", */
    size_t o = 0;
    if (!out)
        return NULL;
    for (size_t i = 0; i < len;) {
        char ch = s[i];
        if (ch == '"') {
            out[o++] = s[i++];
            while (i < len && s[i] != '"') {
                if (s[i] == '\\' && i + 1 < len)
                    out[o++] = s[i++];
                out[o++] = s[i++];
            }
            if (i < len)
                out[o++] = s[i++];
        } else if (ch == '-' || (ch >= '0' && ch <= '9')) {
            /* The whole run of number characters is one token; only a JSON integer,
             * -?(0|[1-9][0-9]*), is quoted. Anything else (1.5, 1e3, but also 1-2 or --1) is
             * left for cJSON to judge: quoting "1-2" would turn a body that is not JSON into
             * one with an id. */
            size_t j = i;
            while (j < len && (s[j] == '-' || s[j] == '+' || s[j] == '.' || s[j] == 'e' ||
                               s[j] == 'E' || (s[j] >= '0' && s[j] <= '9')))
                j++;
            size_t d = i + (ch == '-');
            int integer = d < j && (s[d] != '0' || d + 1 == j);
            for (size_t k = d; integer && k < j; k++)
                integer = s[k] >= '0' && s[k] <= '9';
            if (integer)
                out[o++] = '"';
            while (i < j)
                out[o++] = s[i++];
            if (integer)
                out[o++] = '"';
        } else {
            out[o++] = s[i++];
        }
    }
    out[o] = '\0';
    return out;
}

/* Whether cJSON accepts body[0..len) whole (trailing whitespace allowed). */
static int json_whole(const char *body, size_t len)
{
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!doc)
        return 0;
    while (end && end < body + len && (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t'))
        end++;
    cJSON_Delete(doc);
    return end == body + len;
}

cJSON *prov_id_doc(const char *body, size_t len)
{
    /* Quoting integers turns some bodies that are not JSON into JSON (an integer where a key
     * belongs: {1:2}): the body itself must be JSON first. */
    if (!body || !json_whole(body, len))
        return NULL;
    char *q = quote_integers(body, len);
    if (!q)
        return NULL;
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithOpts(q, &end, 0);
    if (doc && end && *end) {
        while (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t')
            end++;
        if (*end) {
            cJSON_Delete(doc);
            doc = NULL;
        }
    }
    free(q);
    return doc;
}

const char *prov_read_id(const struct jpath *path, const cJSON *doc)
{
    const char *id = path ? jpath_string(path, doc) : NULL;
    /* Not UTF-8 (raw bytes in the provider's JSON): no id — stored, it would be refused by the
     * database with the whole write (the paid answer with it); changed, it would name another
     * task. The paths for a task whose id cannot be read follow. */
    if (!id || !*id || strlen(id) > 255 || !utf8_valid(id, strlen(id)))
        return NULL;
    return id;
}
