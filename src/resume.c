#include "idemgate/resume.h"

#include "idemgate/jpath.h"
#include "idemgate/sse.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int resume_point(const struct cfg_provider *p, const char *req, size_t req_len, const char *rec,
                 size_t rec_len, struct resume_point *out)
{
    memset(out, 0, sizeof(*out));
    if (!p->resume_query || !p->resume_when || !p->resume_sequence || !req || !rec || !rec_len)
        return 0;
    const char *end = NULL;
    cJSON *body = cJSON_ParseWithLengthOpts(req, req_len, &end, 0);
    int when = body && cJSON_IsTrue(jpath_first(p->resume_when, body));
    cJSON_Delete(body);
    if (!when)
        return 0;
    size_t at = 0, dlen = 0;
    char *data = NULL;
    int r = sse_last_event(rec, rec_len, &at, &data, &dlen);
    if (r <= 0)
        return r;
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
    return ok;
}

char *resume_join(const char *rec, const struct resume_point *pt, const char *more,
                  size_t more_len, size_t *out_len)
{
    size_t n = pt->prefix_len + more_len;
    char *out = malloc(n ? n : 1);
    if (!out)
        return NULL;
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
