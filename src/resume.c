#include "idemgate/resume.h"

#include "idemgate/jpath.h"
#include "idemgate/sse.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Whether rec's stream names generation id (its first event naming one: a Responses stream's
 * response.created). A record left by an earlier attempt's generation is not this one's start. */
static int names(const struct cfg_provider *p, const char *rec, size_t rec_len, const char *id)
{
    struct sse_verdict v;
    if (sse_read((enum sse_format)p->stream_format, rec, rec_len, &v) < 0)
        return -1;
    int same = id && strcmp(v.id, id) == 0;
    sse_verdict_fini(&v);
    return same;
}

int resume_record_end(const struct cfg_provider *p, const char *rec, size_t rec_len,
                      const char *id)
{
    struct sse_verdict v;
    if (!rec || !rec_len || !id || !*id)
        return RE_OPEN;
    if (sse_read((enum sse_format)p->stream_format, rec, rec_len, &v) < 0)
        return -1;
    int end = strcmp(v.id, id) != 0 || !v.terminal ? RE_OPEN : v.error ? RE_FAILED : RE_WHOLE;
    sse_verdict_fini(&v);
    return end;
}

int resume_point(const struct cfg_provider *p, const char *req, size_t req_len, const char *rec,
                 size_t rec_len, const char *id, struct resume_point *out)
{
    memset(out, 0, sizeof(*out));
    out->after = -1;
    if (!p->resume_query || !p->resume_when || !p->resume_sequence || !req)
        return 0;
    const char *end = NULL;
    cJSON *body = cJSON_ParseWithLengthOpts(req, req_len, &end, 0);
    int when = body && cJSON_IsTrue(jpath_first(p->resume_when, body));
    cJSON_Delete(body);
    if (!when)
        return 0;
    /* From the start, where the profile can: nothing kept, nothing whole, or not this
     * generation's (an earlier attempt's answer left on the row). */
    int from_start = p->resume_start_query ? 1 : 0;
    int same = rec && rec_len ? names(p, rec, rec_len, id) : 0;
    if (same < 0)
        return -1;
    if (!same)
        return from_start;
    size_t at = 0, dlen = 0;
    char *data = NULL;
    int r = sse_last_event(rec, rec_len, &at, &data, &dlen);
    if (r <= 0)
        return r < 0 ? -1 : from_start;
    cJSON *d = cJSON_ParseWithLengthOpts(data, dlen, &end, 0);
    const cJSON *n = d ? jpath_first(p->resume_sequence, d) : NULL;
    int ok = cJSON_IsNumber(n) && n->valuedouble >= 0 && n->valuedouble < 9e15 &&
             floor(n->valuedouble) == n->valuedouble;
    if (ok) {
        out->after = (long long)n->valuedouble;
        out->prefix_len = at;
    }
    cJSON_Delete(d);
    free(data);
    return ok ? 1 : from_start;
}

char *resume_join(const char *rec, const struct resume_point *pt, const char *more,
                  size_t more_len, size_t *out_len)
{
    size_t n = pt->prefix_len + more_len;
    char *out = malloc(n ? n : 1);
    if (!out)
        return NULL;
    if (pt->prefix_len)
        memcpy(out, rec, pt->prefix_len);
    if (more_len)
        memcpy(out + pt->prefix_len, more, more_len);
    *out_len = n;
    return out;
}

int resume_note_due(size_t noted, size_t pending, double seconds)
{
    return seconds >= 1.0 && pending >= 512 && pending >= noted / 2;
}

int resume_again_later(int curl_code, int http_status, int stream_2xx, int truncated)
{
    if (truncated)
        return 0;
    if (curl_code)
        return 1;
    if (http_status >= 200 && http_status < 300)
        return stream_2xx;
    return http_status == 408 || http_status == 425 || http_status == 429 || http_status >= 500;
}
