/* Server-sent event streams of the LLM APIs: terminal event, error event, usage (sse.h). */
#include "idemgate/sse.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[] = {"", "openai-chat", "anthropic", "openai-responses"};

int sse_format_parse(const char *name)
{
    for (size_t i = 1; name && i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(name, names[i]) == 0)
            return (int)i;
    return -1;
}

const char *sse_format_name(enum sse_format f)
{
    return (size_t)f < sizeof(names) / sizeof(names[0]) ? names[f] : "";
}

/* What one reading collects while it goes. */
struct reading {
    enum sse_format f;
    struct sse_verdict *v;
    cJSON *usage; /* merged so far (Anthropic), or the last one reported */
    int oom;
};

static const cJSON *member(const cJSON *o, const char *name)
{
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, name) : NULL;
}

/* Replaces the usage kept with a copy of u (an object), or, merging, overlays u's members. */
static void take_usage(struct reading *rd, const cJSON *u, int merge)
{
    if (!cJSON_IsObject(u))
        return;
    if (!merge || !rd->usage) {
        cJSON *c = cJSON_Duplicate(u, 1);
        if (!c) {
            rd->oom = 1;
            return;
        }
        cJSON_Delete(rd->usage);
        rd->usage = c;
        return;
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, u)
    {
        cJSON *c = cJSON_Duplicate(m, 1);
        if (!c || !m->string) {
            cJSON_Delete(c);
            rd->oom = 1;
            return;
        }
        if (cJSON_GetObjectItemCaseSensitive(rd->usage, m->string))
            cJSON_ReplaceItemInObjectCaseSensitive(rd->usage, m->string, c);
        else
            cJSON_AddItemToObject(rd->usage, m->string, c);
    }
}

/* One whole event: its type (the `event:` field, or "" when none) and its data. */
static void on_event(struct reading *rd, const char *type, const char *data, size_t dlen)
{
    struct sse_verdict *v = rd->v;
    v->events++;
    if (rd->f == SSE_OPENAI_CHAT && dlen == 6 && memcmp(data, "[DONE]", 6) == 0) {
        v->terminal = 1;
        return;
    }
    const char *end = NULL;
    cJSON *d = dlen ? cJSON_ParseWithLengthOpts(data, dlen, &end, 0) : NULL;
    if (d && end != data + dlen) {
        cJSON_Delete(d);
        d = NULL;
    }
    const cJSON *t = member(d, "type");
    const char *kind = *type ? type : cJSON_IsString(t) ? t->valuestring : "";
    switch (rd->f) {
    case SSE_OPENAI_CHAT:
        if (member(d, "error"))
            v->error = 1;
        if (cJSON_IsObject(member(d, "usage")))
            take_usage(rd, member(d, "usage"), 0);
        break;
    case SSE_ANTHROPIC:
        if (strcmp(kind, "message_stop") == 0)
            v->terminal = 1;
        else if (strcmp(kind, "error") == 0)
            v->error = 1;
        else if (strcmp(kind, "message_start") == 0)
            take_usage(rd, member(member(d, "message"), "usage"), 0);
        else if (strcmp(kind, "message_delta") == 0)
            take_usage(rd, member(d, "usage"), 1);
        break;
    case SSE_OPENAI_RESPONSES:
        if (strcmp(kind, "response.completed") == 0 || strcmp(kind, "response.incomplete") == 0)
            v->terminal = 1;
        else if (strcmp(kind, "response.failed") == 0)
            v->terminal = v->error = 1;
        else if (strcmp(kind, "error") == 0)
            v->error = 1;
        if (cJSON_IsObject(member(member(d, "response"), "usage")))
            take_usage(rd, member(member(d, "response"), "usage"), 0);
        break;
    default:
        break;
    }
    cJSON_Delete(d);
}

int sse_read(enum sse_format f, const char *body, size_t len, struct sse_verdict *v)
{
    memset(v, 0, sizeof(*v));
    struct reading rd = {.f = f, .v = v};
    char type[64] = "";
    char *data = NULL;
    size_t dlen = 0, dcap = 0;
    int have_data = 0;
    size_t i = 0;
    while (i < len && !rd.oom) {
        /* One line: up to CR, LF or CRLF (WHATWG's event stream); a last line without its end
         * is an event cut off, never dispatched. */
        size_t s = i;
        while (i < len && body[i] != '\r' && body[i] != '\n')
            i++;
        if (i == len)
            break;
        size_t e = i;
        i += (body[i] == '\r' && i + 1 < len && body[i + 1] == '\n') ? 2 : 1;
        if (e == s) { /* a blank line dispatches */
            if (have_data || *type)
                on_event(&rd, type, data ? data : "", dlen);
            type[0] = '\0';
            dlen = 0;
            have_data = 0;
            continue;
        }
        if (body[s] == ':')
            continue; /* a comment (a keep-alive) */
        size_t c = s;
        while (c < e && body[c] != ':')
            c++;
        size_t vs = c < e ? c + 1 : e;
        if (vs < e && body[vs] == ' ')
            vs++;
        size_t fl = c - s, vl = e - vs;
        if (fl == 5 && memcmp(body + s, "event", 5) == 0) {
            size_t n = vl < sizeof(type) - 1 ? vl : sizeof(type) - 1;
            memcpy(type, body + vs, n);
            type[n] = '\0';
        } else if (fl == 4 && memcmp(body + s, "data", 4) == 0) {
            size_t need = dlen + (have_data ? 1 : 0) + vl + 1;
            if (need > dcap) {
                size_t cap = dcap ? dcap * 2 : 256;
                while (cap < need)
                    cap *= 2;
                char *nd = realloc(data, cap);
                if (!nd) {
                    rd.oom = 1;
                    break;
                }
                data = nd;
                dcap = cap;
            }
            if (have_data)
                data[dlen++] = '\n';
            memcpy(data + dlen, body + vs, vl);
            dlen += vl;
            data[dlen] = '\0';
            have_data = 1;
        }
    }
    free(data);
    if (rd.usage && !rd.oom) {
        v->usage = cJSON_PrintUnformatted(rd.usage);
        if (!v->usage)
            rd.oom = 1;
    }
    cJSON_Delete(rd.usage);
    if (rd.oom) {
        free(v->usage);
        v->usage = NULL;
        return -1;
    }
    return 0;
}

void sse_verdict_fini(struct sse_verdict *v)
{
    free(v->usage);
    v->usage = NULL;
}

int sse_requested(const char *body, size_t len)
{
    const char *end = NULL;
    cJSON *d = body && len ? cJSON_ParseWithLengthOpts(body, len, &end, 0) : NULL;
    int yes = d && cJSON_IsTrue(member(d, "stream"));
    cJSON_Delete(d);
    return yes;
}
