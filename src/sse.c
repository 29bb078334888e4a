/* Server-sent event streams of the LLM APIs: terminal event, error event, usage (sse.h). */
#include "idemgate/sse.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const sse_delivery_members[] = {"stream", "stream_options", NULL};

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

static const struct {
    const char *type;
    int status;
} error_types[] = {
    {"invalid_request_error", 400}, {"invalid_prompt", 400},       {"authentication_error", 401},
    {"invalid_api_key", 401},       {"billing_error", 402},        {"permission_error", 403},
    {"not_found_error", 404},       {"request_too_large", 413},    {"rate_limit_error", 429},
    {"rate_limit_exceeded", 429},   {"insufficient_quota", 429},   {"api_error", 500},
    {"server_error", 500},          {"server_is_overloaded", 503}, {"slow_down", 503},
    {"timeout_error", 504},         {"overloaded_error", 529},
};

int sse_error_status(const char *type)
{
    for (size_t i = 0; type && i < sizeof(error_types) / sizeof(error_types[0]); i++)
        if (strcmp(type, error_types[i].type) == 0)
            return error_types[i].status;
    return 0;
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

static const char *string_of(const cJSON *o, const char *name)
{
    return cJSON_GetStringValue(member(o, name));
}

/* The first error event: its type (the error object's code, else its type) and status. */
static void take_error(struct sse_verdict *v, const cJSON *err)
{
    if (v->error)
        return;
    v->error = 1;
    const char *t = string_of(err, "code");
    if (!t || !*t)
        t = string_of(err, "type");
    snprintf(v->error_type, sizeof(v->error_type), "%s", t ? t : "");
    v->error_status = sse_error_status(t);
}

/* Whether an OpenAI chat chunk carries output: a choice whose delta holds anything but its role,
 * a null, or an empty string — text, a refusal, a tool or function call, and what compatible
 * providers and audio models stream (reasoning_content, reasoning, audio): each is generated,
 * and billed — or a finish reason. Only the first chunk's role and empty content are not output:
 * an error after a chunk read as none would be taken for a refusal of a create that made
 * nothing, and sent again. */
static int chat_output(const cJSON *d)
{
    const cJSON *c, *m;
    cJSON_ArrayForEach(c, member(d, "choices"))
    {
        if (string_of(c, "finish_reason"))
            return 1;
        cJSON_ArrayForEach(m, member(c, "delta"))
        {
            if ((m->string && strcmp(m->string, "role") == 0) || cJSON_IsNull(m) ||
                (cJSON_IsString(m) && !*m->valuestring))
                continue;
            return 1;
        }
    }
    return 0;
}

/* One whole event: its type (the `event:` field, else the data's "type"), its data parsed (NULL
 * when not JSON) and raw. */
static void on_event(void *arg, const char *kind, const cJSON *d, const char *data, size_t dlen)
{
    struct reading *rd = arg;
    struct sse_verdict *v = rd->v;
    v->events++;
    if (!v->id[0]) {
        const char *id = rd->f == SSE_OPENAI_RESPONSES ? string_of(member(d, "response"), "id")
                         : rd->f == SSE_ANTHROPIC      ? string_of(member(d, "message"), "id")
                                                       : string_of(d, "id");
        if (id && strlen(id) < sizeof(v->id))
            memcpy(v->id, id, strlen(id) + 1);
    }
    if (rd->f == SSE_OPENAI_CHAT && dlen == 6 && memcmp(data, "[DONE]", 6) == 0) {
        v->terminal = 1;
        return;
    }
    switch (rd->f) {
    case SSE_OPENAI_CHAT:
        /* "error": null (some compatible servers put it in every chunk) is no error: taken for
         * one, a whole answer was in doubt (unknown, then review). */
        if (member(d, "error") && !cJSON_IsNull(member(d, "error")))
            take_error(v, member(d, "error"));
        else if (!v->error && chat_output(d))
            v->output = 1;
        if (cJSON_IsObject(member(d, "usage")))
            take_usage(rd, member(d, "usage"), 0);
        break;
    case SSE_ANTHROPIC:
        if (strcmp(kind, "message_stop") == 0)
            v->terminal = 1;
        else if (strcmp(kind, "error") == 0)
            take_error(v, member(d, "error"));
        else if (!v->error && strcmp(kind, "ping") != 0 && strcmp(kind, "message_start") != 0)
            v->output = 1; /* a content block, a delta, the message's end */
        if (strcmp(kind, "message_start") == 0)
            take_usage(rd, member(member(d, "message"), "usage"), 0);
        else if (strcmp(kind, "message_delta") == 0)
            take_usage(rd, member(d, "usage"), 1);
        break;
    case SSE_OPENAI_RESPONSES:
        if (strcmp(kind, "response.failed") == 0) {
            v->terminal = 1;
            take_error(v, member(member(d, "response"), "error"));
        } else if (strcmp(kind, "error") == 0) {
            take_error(v, d);
        } else if (!v->error && strcmp(kind, "response.created") != 0 &&
                   strcmp(kind, "response.queued") != 0 &&
                   strcmp(kind, "response.in_progress") != 0) {
            v->output = 1; /* an output item or delta, or the response's end */
        }
        if (strcmp(kind, "response.completed") == 0 || strcmp(kind, "response.incomplete") == 0)
            v->terminal = 1;
        if (cJSON_IsObject(member(member(d, "response"), "usage")))
            take_usage(rd, member(member(d, "response"), "usage"), 0);
        break;
    default:
        break;
    }
}

typedef int (*parse_need)(void *arg, const char *type, const char *data, size_t dlen);
static int each_event(const char *body, size_t len,
                      void (*fn)(void *arg, const char *type, const cJSON *d, const char *raw,
                                 size_t rawlen),
                      parse_need need, void *arg, size_t *end);

/* 1 when data holds the member qname (quoted) with a value other than null, or where it cannot
 * tell: OpenAI's chunks carry "usage": null on every event when include_usage is asked, and only
 * the last one's needs a parse. */
static int member_not_null(const char *data, size_t dlen, const char *qname)
{
    size_t n = strlen(qname);
    const char *p = data, *end = data + dlen;
    while ((p = memmem(p, (size_t)(end - p), qname, n)) != NULL) {
        const char *q = p + n;
        while (q < end && (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n'))
            q++;
        if (q == end || *q != ':')
            return 1; /* not a member name as far as this scan can tell */
        q++;
        while (q < end && (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n'))
            q++;
        if (end - q < 4 || memcmp(q, "null", 4) != 0)
            return 1;
        p = q + 4;
    }
    return 0;
}

/* Whether an event's data must be parsed for sse_read: a stream is mostly deltas that only say
 * "output" (on_event needs no member of them once the id is known and output seen), and a
 * delta's parse is most of the reading's cost. Conservative: an event whose type is not named
 * by its `event:` line, or whose raw data could hold a member on_event reads ("usage" other than
 * null, "error", or any \u escape, which could spell one), is parsed. */
static int read_needs(void *arg, const char *type, const char *data, size_t dlen)
{
    const struct reading *rd = arg;
    const struct sse_verdict *v = rd->v;
    if (!v->id[0] || (!v->output && !v->error) || memmem(data, dlen, "\\u", 2))
        return 1;
    switch (rd->f) {
    case SSE_OPENAI_CHAT:
        return member_not_null(data, dlen, "\"usage\"") || memmem(data, dlen, "\"error\"", 7) ||
               (dlen == 6 && memcmp(data, "[DONE]", 6) == 0);
    case SSE_ANTHROPIC:
        return strcmp(type, "content_block_delta") != 0 && strcmp(type, "ping") != 0;
    case SSE_OPENAI_RESPONSES: {
        size_t t = strlen(type);
        return !(t > 6 && strcmp(type + t - 6, ".delta") == 0);
    }
    default:
        return 1;
    }
}

/* sse_last_event reads no member. */
static int never_parse(void *arg, const char *type, const char *data, size_t dlen)
{
    (void)arg;
    (void)type;
    (void)data;
    (void)dlen;
    return 0;
}

int sse_read(enum sse_format f, const char *body, size_t len, struct sse_verdict *v)
{
    memset(v, 0, sizeof(*v));
    struct reading rd = {.f = f, .v = v};
    if (each_event(body, len, on_event, read_needs, &rd, NULL) < 0)
        rd.oom = 1;
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

int sse_body_flag(const char *body, size_t len, const char *name)
{
    const char *end = NULL;
    cJSON *d = body && len ? cJSON_ParseWithLengthOpts(body, len, &end, 0) : NULL;
    int yes = d && cJSON_IsTrue(member(d, name));
    cJSON_Delete(d);
    return yes;
}

int sse_requested(const char *body, size_t len)
{
    return sse_body_flag(body, len, "stream");
}

/* sse_last_event's reading: the last whole event so far, its data copied (each_event reuses
 * its buffer) and where it ended. */
struct last_event {
    const size_t *at;
    size_t end;
    char *data;
    size_t dlen;
    int found, oom;
};

static void on_last(void *arg, const char *type, const cJSON *d, const char *raw, size_t rawlen)
{
    (void)type;
    (void)d;
    struct last_event *l = arg;
    char *n = malloc(rawlen + 1);
    if (!n) {
        l->oom = 1;
        return;
    }
    memcpy(n, raw, rawlen);
    n[rawlen] = '\0';
    free(l->data);
    l->data = n;
    l->dlen = rawlen;
    l->end = *l->at;
    l->found = 1;
}

int sse_last_event(const char *body, size_t len, size_t *end, char **data, size_t *dlen)
{
    size_t at = 0;
    struct last_event l = {.at = &at};
    *end = 0;
    *data = NULL;
    *dlen = 0;
    if (each_event(body, len, on_last, never_parse, &l, &at) < 0 || l.oom) {
        free(l.data);
        return -1;
    }
    if (!l.found)
        return 0;
    *end = l.end;
    *data = l.data;
    *dlen = l.dlen;
    return 1;
}

/* ---- whole answers from streams, and streams from whole answers ---------------------- */

/* Calls fn(arg, type, data parsed, data raw) for each whole event of body, read as WHATWG's
 * event stream: lines end in CR, LF or CRLF; a blank line dispatches; `:` starts a comment; a
 * last line without its end is an event cut off, never dispatched. The data is NULL when not
 * JSON; the type "" when the event named none and the data has no "type". *at (when not NULL)
 * is, during each call, the offset just past the blank line that dispatched it. Returns -1 when
 * out of memory. */
static int each_event(const char *body, size_t len,
                      void (*fn)(void *arg, const char *type, const cJSON *d, const char *raw,
                                 size_t rawlen),
                      parse_need need, void *arg, size_t *at)
{
    char type[64] = "";
    char *data = NULL;
    size_t dlen = 0, dcap = 0, i = 0;
    int have = 0;
    while (i < len) {
        size_t s = i;
        while (i < len && body[i] != '\r' && body[i] != '\n')
            i++;
        if (i == len)
            break;
        size_t e = i;
        i += (body[i] == '\r' && i + 1 < len && body[i + 1] == '\n') ? 2 : 1;
        if (e == s) {
            if (have || *type) {
                const char *end = NULL;
                cJSON *d = dlen && (!need || need(arg, type, data, dlen))
                               ? cJSON_ParseWithLengthOpts(data, dlen, &end, 0)
                               : NULL;
                if (d && end != data + dlen) {
                    cJSON_Delete(d);
                    d = NULL;
                }
                const cJSON *t = member(d, "type");
                if (at)
                    *at = i;
                fn(arg, *type ? type : cJSON_IsString(t) ? t->valuestring : "", d,
                   data ? data : "", dlen);
                cJSON_Delete(d);
            }
            type[0] = '\0';
            dlen = 0;
            have = 0;
            continue;
        }
        if (body[s] == ':')
            continue;
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
            size_t want = dlen + (have ? 1 : 0) + vl + 1;
            if (want > dcap) {
                size_t cap = dcap ? dcap * 2 : 256;
                while (cap < want)
                    cap *= 2;
                char *nd = realloc(data, cap);
                if (!nd) {
                    free(data);
                    return -1;
                }
                data = nd;
                dcap = cap;
            }
            if (have)
                data[dlen++] = '\n';
            memcpy(data + dlen, body + vs, vl);
            dlen += vl;
            data[dlen] = '\0';
            have = 1;
        }
    }
    free(data);
    return 0;
}

/* OpenAI Chat's `n` goes up to 128: a choice past it is not assembled, and the answer is then
 * served as recorded (never shown with choices missing). */
#define MAX_CHOICES 128

/* Text appended to a member of an object of the answer being built, kept in a growing buffer
 * and set once at the end: a stream of many small deltas is assembled in linear time. */
struct pending {
    cJSON *obj;
    const char *name; /* a static string */
    char *buf;
    size_t len, cap;
};

#define MAX_TOOL_CALLS 128

struct assembly {
    enum sse_format f;
    cJSON *out;              /* the answer being built */
    cJSON *choice[MAX_CHOICES]; /* OpenAI Chat: the message of each choice */
    cJSON *content;          /* Anthropic: the content array */
    struct pending *texts;
    size_t n_texts, cap_texts;
    int oom;
    /* A delta this assembler does not know how to fold into the answer: no answer is made (a
     * client then gets the stream as it was recorded), never one that silently lacks a part —
     * tool calls dropped from a Chat answer read as "finish_reason: tool_calls" with none. */
    int unknown;
};

/* Appends text to the string member name of o (its current value first, the first time). */
static void append_text(struct assembly *a, cJSON *o, const char *name, const char *text)
{
    struct pending *p = NULL;
    for (size_t i = a->n_texts; i-- > 0;)
        if (a->texts[i].obj == o && strcmp(a->texts[i].name, name) == 0) {
            p = &a->texts[i];
            break;
        }
    if (!p) {
        if (a->n_texts == a->cap_texts) {
            size_t cap = a->cap_texts ? 2 * a->cap_texts : 8;
            struct pending *nt = realloc(a->texts, cap * sizeof(*nt));
            if (!nt) {
                a->oom = 1;
                return;
            }
            a->texts = nt;
            a->cap_texts = cap;
        }
        p = &a->texts[a->n_texts++];
        *p = (struct pending){.obj = o, .name = name};
        const cJSON *cur = cJSON_GetObjectItemCaseSensitive(o, name);
        if (cJSON_IsString(cur) && *cur->valuestring)
            append_text(a, o, name, cur->valuestring);
        if (a->oom)
            return;
    }
    size_t n = strlen(text);
    if (p->len + n + 1 > p->cap) {
        size_t cap = p->cap ? p->cap : 64;
        while (cap < p->len + n + 1)
            cap *= 2;
        char *nb = realloc(p->buf, cap);
        if (!nb) {
            a->oom = 1;
            return;
        }
        p->buf = nb;
        p->cap = cap;
    }
    memcpy(p->buf + p->len, text, n + 1);
    p->len += n;
}

/* Sets every member text was appended to, and frees the buffers. */
static void settle_texts(struct assembly *a)
{
    for (size_t i = 0; i < a->n_texts; i++) {
        struct pending *p = &a->texts[i];
        cJSON *v = !a->oom ? cJSON_CreateString(p->buf ? p->buf : "") : NULL;
        if (!v)
            a->oom = 1;
        else if (cJSON_GetObjectItemCaseSensitive(p->obj, p->name))
            cJSON_ReplaceItemInObjectCaseSensitive(p->obj, p->name, v);
        else
            cJSON_AddItemToObject(p->obj, p->name, v);
        free(p->buf);
    }
    free(a->texts);
    a->texts = NULL;
    a->n_texts = a->cap_texts = 0;
}

static void set_member(struct assembly *a, cJSON *o, const char *name, const cJSON *v)
{
    cJSON *c = cJSON_Duplicate(v, 1);
    if (!c) {
        a->oom = 1;
        return;
    }
    if (cJSON_GetObjectItemCaseSensitive(o, name))
        cJSON_ReplaceItemInObjectCaseSensitive(o, name, c);
    else
        cJSON_AddItemToObject(o, name, c);
}

/* One piece of a streamed tool call: {index, id, type, function: {name, arguments}}; the name
 * and the arguments arrive in pieces, appended in order. */
static void chat_tool_call(struct assembly *a, cJSON *calls, const cJSON *t)
{
    const cJSON *ix = member(t, "index");
    if (!cJSON_IsNumber(ix) || ix->valueint < 0 || ix->valueint >= MAX_TOOL_CALLS) {
        a->unknown = 1;
        return;
    }
    while (cJSON_GetArraySize(calls) <= ix->valueint) {
        cJSON *call = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        if (!call || !fn || !cJSON_AddStringToObject(fn, "name", "") ||
            !cJSON_AddStringToObject(fn, "arguments", "")) {
            cJSON_Delete(call);
            cJSON_Delete(fn);
            a->oom = 1;
            return;
        }
        cJSON_AddItemToObject(call, "function", fn);
        cJSON_AddItemToArray(calls, call);
    }
    cJSON *call = cJSON_GetArrayItem(calls, ix->valueint);
    cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
    const cJSON *m;
    cJSON_ArrayForEach(m, t)
    {
        if (!m->string || !strcmp(m->string, "index") || cJSON_IsNull(m))
            continue;
        if ((!strcmp(m->string, "id") || !strcmp(m->string, "type")) && cJSON_IsString(m))
            set_member(a, call, m->string, m);
        else if (!strcmp(m->string, "function") && cJSON_IsObject(m)) {
            const cJSON *f;
            cJSON_ArrayForEach(f, m)
            {
                if (f->string && (!strcmp(f->string, "name") || !strcmp(f->string, "arguments")) &&
                    cJSON_IsString(f))
                    append_text(a, fn, !strcmp(f->string, "name") ? "name" : "arguments",
                                f->valuestring);
                else if (!cJSON_IsNull(f))
                    a->unknown = 1;
            }
        } else
            a->unknown = 1;
    }
}

/* The message's text members a Chat delta extends (the reasoning of compatible providers among
 * them), as a static name; NULL for any other. */
static const char *chat_text(const char *name)
{
    static const char *const texts[] = {"content", "refusal", "reasoning_content", "reasoning"};
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++)
        if (!strcmp(name, texts[i]))
            return texts[i];
    return NULL;
}

static void chat_tool_calls(struct assembly *a, cJSON *msg, const cJSON *list)
{
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    if (!calls && !(calls = cJSON_AddArrayToObject(msg, "tool_calls"))) {
        a->oom = 1;
        return;
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, list)
    {
        chat_tool_call(a, calls, t);
    }
}

static void assemble_chat(struct assembly *a, const cJSON *d)
{
    if (!cJSON_IsObject(d))
        return;
    if (!a->out) {
        a->out = cJSON_CreateObject();
        if (!a->out) {
            a->oom = 1;
            return;
        }
        static const char *const copied[] = {"id", "created", "model", "system_fingerprint",
                                             "service_tier"};
        for (size_t i = 0; i < sizeof(copied) / sizeof(copied[0]); i++)
            if (member(d, copied[i]))
                set_member(a, a->out, copied[i], member(d, copied[i]));
        cJSON_AddStringToObject(a->out, "object", "chat.completion");
        cJSON_AddArrayToObject(a->out, "choices");
    }
    const cJSON *c;
    cJSON_ArrayForEach(c, member(d, "choices"))
    {
        const cJSON *ix = member(c, "index");
        int i = cJSON_IsNumber(ix) ? ix->valueint : 0;
        if (i < 0 || i >= MAX_CHOICES) {
            a->unknown = 1;
            continue;
        }
        if (!a->choice[i]) {
            cJSON *choice = cJSON_CreateObject();
            cJSON *msg = cJSON_CreateObject();
            if (!choice || !msg) {
                cJSON_Delete(choice);
                cJSON_Delete(msg);
                a->oom = 1;
                return;
            }
            cJSON_AddNumberToObject(choice, "index", i);
            cJSON_AddStringToObject(msg, "role", "assistant");
            cJSON_AddItemToObject(choice, "message", msg);
            cJSON_AddNullToObject(choice, "finish_reason");
            cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(a->out, "choices"), choice);
            a->choice[i] = choice;
        }
        cJSON *msg = cJSON_GetObjectItemCaseSensitive(a->choice[i], "message");
        const cJSON *delta = member(c, "delta"), *m;
        cJSON_ArrayForEach(m, delta)
        {
            if (!m->string || cJSON_IsNull(m))
                continue;
            if (!strcmp(m->string, "role") && cJSON_IsString(m))
                set_member(a, msg, "role", m);
            else if (cJSON_IsString(m) && chat_text(m->string))
                append_text(a, msg, chat_text(m->string), m->valuestring);
            else if (!strcmp(m->string, "tool_calls") && cJSON_IsArray(m))
                chat_tool_calls(a, msg, m);
            else
                a->unknown = 1;
        }
        if (cJSON_IsString(member(c, "finish_reason")))
            set_member(a, a->choice[i], "finish_reason", member(c, "finish_reason"));
        if (member(c, "logprobs") && !cJSON_IsNull(member(c, "logprobs")))
            a->unknown = 1; /* per-token log probabilities: not assembled here */
    }
    if (cJSON_IsObject(member(d, "usage")))
        set_member(a, a->out, "usage", member(d, "usage"));
}

static void assemble_anthropic(struct assembly *a, const char *type, const cJSON *d)
{
    if (strcmp(type, "message_start") == 0 && cJSON_IsObject(member(d, "message"))) {
        for (size_t i = 0; i < a->n_texts; i++) /* a second start: what came before is gone */
            free(a->texts[i].buf);
        a->n_texts = 0;
        cJSON_Delete(a->out);
        a->content = NULL; /* it was in the answer just freed */
        a->out = cJSON_Duplicate(member(d, "message"), 1);
        if (!a->out) {
            a->oom = 1;
            return;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(a->out, "content");
        a->content = cJSON_AddArrayToObject(a->out, "content");
        if (!a->content)
            a->oom = 1;
        return;
    }
    if (!a->out || !a->content)
        return;
    const cJSON *ix = member(d, "index");
    int i = cJSON_IsNumber(ix) ? ix->valueint : -1;
    if (strcmp(type, "content_block_start") == 0 && cJSON_IsObject(member(d, "content_block"))) {
        if (i == cJSON_GetArraySize(a->content)) {
            cJSON *b = cJSON_Duplicate(member(d, "content_block"), 1);
            if (!b)
                a->oom = 1;
            else
                cJSON_AddItemToArray(a->content, b);
        }
    } else if (strcmp(type, "content_block_delta") == 0 && i >= 0 &&
               i < cJSON_GetArraySize(a->content)) {
        cJSON *b = cJSON_GetArrayItem(a->content, i);
        const cJSON *delta = member(d, "delta");
        const cJSON *dt = member(delta, "type");
        /* Each kind of delta and the member of its block it extends; input_json_delta's pieces
         * are the tool's input as JSON text, parsed once whole (tool_inputs). */
        static const struct {
            const char *type, *field, *member;
        } kinds[] = {{"text_delta", "text", "text"},
                     {"thinking_delta", "thinking", "thinking"},
                     {"signature_delta", "signature", "signature"},
                     {"input_json_delta", "partial_json", "input"}};
        size_t k = 0;
        while (k < sizeof(kinds) / sizeof(kinds[0]) &&
               !(cJSON_IsString(dt) && !strcmp(dt->valuestring, kinds[k].type)))
            k++;
        if (k == sizeof(kinds) / sizeof(kinds[0]) ||
            !cJSON_IsString(member(delta, kinds[k].field)))
            a->unknown = 1;
        else if (k == 3 && !cJSON_IsString(member(b, "input")) &&
                 cJSON_GetArraySize(member(b, "input")) > 0)
            a->unknown = 1; /* a start that gave an input and deltas that give it again */
        else {
            if (k == 3 && !cJSON_IsString(member(b, "input")))
                set_member(a, b, "input", &(cJSON){.type = cJSON_String, .valuestring = ""});
            append_text(a, b, kinds[k].member, member(delta, kinds[k].field)->valuestring);
        }
    } else if (strcmp(type, "message_delta") == 0) {
        const cJSON *delta = member(d, "delta"), *m;
        cJSON_ArrayForEach(m, delta)
        {
            /* The message's fields the stream ends with (stop_reason, stop_sequence…); never
             * its content, assembled from the blocks (a->content and the pending texts point
             * into it), nor its identity or usage (merged below). */
            if (m->string && strcmp(m->string, "content") != 0 && strcmp(m->string, "id") != 0 &&
                strcmp(m->string, "usage") != 0)
                set_member(a, a->out, m->string, m);
        }
        const cJSON *u = member(d, "usage");
        cJSON *mine = cJSON_GetObjectItemCaseSensitive(a->out, "usage");
        if (cJSON_IsObject(u) && cJSON_IsObject(mine))
            cJSON_ArrayForEach(m, u)
            {
                if (m->string)
                    set_member(a, mine, m->string, m);
            }
        else if (cJSON_IsObject(u))
            set_member(a, a->out, "usage", u);
    }
}

/* The inputs of an Anthropic answer's tool blocks, streamed as JSON text (input_json_delta),
 * parsed in place; an empty text is the empty input. -1 when one is not a JSON object. */
static int tool_inputs(cJSON *content)
{
    cJSON *b;
    cJSON_ArrayForEach(b, content)
    {
        cJSON *in = cJSON_GetObjectItemCaseSensitive(b, "input");
        if (!cJSON_IsString(in))
            continue;
        cJSON *v = *in->valuestring ? cJSON_ParseWithOpts(in->valuestring, NULL, 1)
                                    : cJSON_CreateObject();
        if (!cJSON_IsObject(v)) {
            cJSON_Delete(v);
            return -1;
        }
        cJSON_ReplaceItemInObjectCaseSensitive(b, "input", v);
    }
    return 0;
}

static void on_assembly_event(void *arg, const char *type, const cJSON *d, const char *raw,
                              size_t rawlen)
{
    struct assembly *a = arg;
    (void)raw;
    (void)rawlen;
    switch (a->f) {
    case SSE_OPENAI_CHAT:
        assemble_chat(a, d);
        break;
    case SSE_ANTHROPIC:
        assemble_anthropic(a, type, d);
        break;
    case SSE_OPENAI_RESPONSES:
        if ((strcmp(type, "response.completed") == 0 || strcmp(type, "response.incomplete") == 0) &&
            cJSON_IsObject(member(d, "response"))) {
            cJSON_Delete(a->out);
            a->out = cJSON_Duplicate(member(d, "response"), 1);
            if (!a->out)
                a->oom = 1;
        }
        break;
    default:
        break;
    }
}

char *sse_assemble(enum sse_format f, const char *body, size_t len, size_t *out_len)
{
    struct sse_verdict v;
    *out_len = 0;
    if (sse_read(f, body, len, &v) < 0)
        return NULL;
    int whole = v.terminal && !v.error;
    sse_verdict_fini(&v);
    if (!whole)
        return NULL;
    struct assembly a = {.f = f};
    if (each_event(body, len, on_assembly_event, NULL, &a, NULL) < 0)
        a.oom = 1;
    settle_texts(&a);
    if (a.out && !a.oom && a.content && tool_inputs(a.content) < 0)
        a.unknown = 1;
    char *out = a.out && !a.oom && !a.unknown ? cJSON_PrintUnformatted(a.out) : NULL;
    cJSON_Delete(a.out);
    if (out)
        *out_len = strlen(out);
    return out;
}

/* A growing event stream. */
struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
};

/* Appends one event: "event: type\n" (when type) and "data: <doc printed, or raw>\n\n". */
static void put_event(struct sbuf *b, const char *type, const cJSON *doc, const char *raw)
{
    char *data = doc ? cJSON_PrintUnformatted(doc) : NULL;
    const char *d = doc ? data : raw;
    if (!d) {
        b->oom = 1;
        return;
    }
    size_t need = b->len + (type ? strlen(type) + 8 : 0) + strlen(d) + 9;
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < need)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            free(data);
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    if (type)
        b->len += (size_t)sprintf(b->p + b->len, "event: %s\n", type);
    b->len += (size_t)sprintf(b->p + b->len, "data: %s\n\n", d);
    free(data);
}

/* An object {"type": type} with members added by the caller. */
static cJSON *typed(const char *type)
{
    cJSON *o = cJSON_CreateObject();
    if (o)
        cJSON_AddStringToObject(o, "type", type);
    return o;
}

/* A chat.completion.chunk carrying the whole answer's id, created, model and fingerprint, with
 * an empty choices array (returned in *choices); NULL when out of memory. */
static cJSON *chunk_of(const cJSON *whole, cJSON **choices)
{
    static const char *const copied[] = {"id", "created", "model", "system_fingerprint"};
    cJSON *chunk = cJSON_CreateObject();
    if (!chunk)
        return NULL;
    for (size_t i = 0; i < sizeof(copied) / sizeof(copied[0]); i++)
        if (member(whole, copied[i]))
            cJSON_AddItemToObject(chunk, copied[i], cJSON_Duplicate(member(whole, copied[i]), 1));
    cJSON_AddStringToObject(chunk, "object", "chat.completion.chunk");
    *choices = cJSON_AddArrayToObject(chunk, "choices");
    return chunk;
}

static void synth_chat(struct sbuf *b, const cJSON *whole)
{
    const cJSON *c;
    cJSON *choices;
    cJSON_ArrayForEach(c, member(whole, "choices"))
    {
        for (int step = 0; step < 2; step++) {
            cJSON *chunk = chunk_of(whole, &choices);
            if (!chunk) {
                b->oom = 1;
                return;
            }
            cJSON *one = cJSON_CreateObject(), *delta = cJSON_CreateObject();
            cJSON_AddItemToObject(one, "index", cJSON_Duplicate(member(c, "index"), 1));
            const cJSON *msg = member(c, "message");
            if (step == 0) {
                cJSON_AddStringToObject(delta, "role", "assistant");
                if (cJSON_IsString(member(msg, "content")))
                    cJSON_AddItemToObject(delta, "content",
                                          cJSON_Duplicate(member(msg, "content"), 1));
                if (cJSON_IsString(member(msg, "refusal")))
                    cJSON_AddItemToObject(delta, "refusal",
                                          cJSON_Duplicate(member(msg, "refusal"), 1));
                /* Each tool call whole, with its index (as a provider streams its first piece). */
                if (cJSON_IsArray(member(msg, "tool_calls"))) {
                    cJSON *calls = cJSON_Duplicate(member(msg, "tool_calls"), 1);
                    int k = 0;
                    cJSON *t;
                    cJSON_ArrayForEach(t, calls)
                    {
                        cJSON_AddNumberToObject(t, "index", k++);
                    }
                    cJSON_AddItemToObject(delta, "tool_calls", calls);
                }
                cJSON_AddItemToObject(one, "delta", delta);
                cJSON_AddNullToObject(one, "finish_reason");
            } else {
                cJSON_AddItemToObject(one, "delta", delta);
                const cJSON *fr = member(c, "finish_reason");
                cJSON_AddItemToObject(one, "finish_reason",
                                      fr ? cJSON_Duplicate(fr, 1) : cJSON_CreateNull());
            }
            cJSON_AddItemToArray(choices, one);
            put_event(b, NULL, chunk, NULL);
            cJSON_Delete(chunk);
        }
    }
    if (cJSON_IsObject(member(whole, "usage"))) {
        cJSON *chunk = chunk_of(whole, &choices);
        if (!chunk) {
            b->oom = 1;
            return;
        }
        cJSON_AddItemToObject(chunk, "usage", cJSON_Duplicate(member(whole, "usage"), 1));
        put_event(b, NULL, chunk, NULL);
        cJSON_Delete(chunk);
    }
    put_event(b, NULL, NULL, "[DONE]");
}

static void synth_anthropic(struct sbuf *b, const cJSON *whole)
{
    cJSON *start = typed("message_start"), *msg = cJSON_Duplicate(whole, 1);
    if (!start || !msg) {
        cJSON_Delete(start);
        cJSON_Delete(msg);
        b->oom = 1;
        return;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(msg, "content");
    cJSON_AddArrayToObject(msg, "content");
    /* The stop reason comes with message_delta, as the provider streams it. */
    if (member(msg, "stop_reason"))
        cJSON_ReplaceItemInObjectCaseSensitive(msg, "stop_reason", cJSON_CreateNull());
    if (member(msg, "stop_sequence"))
        cJSON_ReplaceItemInObjectCaseSensitive(msg, "stop_sequence", cJSON_CreateNull());
    cJSON_AddItemToObject(start, "message", msg);
    put_event(b, "message_start", start, NULL);
    cJSON_Delete(start);
    int i = 0;
    const cJSON *block;
    cJSON_ArrayForEach(block, member(whole, "content"))
    {
        cJSON *bs = typed("content_block_start"), *empty = cJSON_Duplicate(block, 1);
        cJSON_AddNumberToObject(bs, "index", i);
        const char *field = NULL;
        const cJSON *bt = member(block, "type");
        if (cJSON_IsString(bt) && strcmp(bt->valuestring, "text") == 0)
            field = "text";
        else if (cJSON_IsString(bt) && strcmp(bt->valuestring, "thinking") == 0)
            field = "thinking";
        /* A tool's input comes as JSON text in one input_json_delta, after a start whose
         * input is empty, as the provider streams it. */
        int tool = cJSON_IsObject(member(block, "input"));
        if (field) {
            cJSON_DeleteItemFromObjectCaseSensitive(empty, field);
            cJSON_AddStringToObject(empty, field, "");
        } else if (tool) {
            cJSON_ReplaceItemInObjectCaseSensitive(empty, "input", cJSON_CreateObject());
        }
        cJSON_AddItemToObject(bs, "content_block", empty);
        put_event(b, "content_block_start", bs, NULL);
        cJSON_Delete(bs);
        if (field && cJSON_IsString(member(block, field))) {
            cJSON *bd = typed("content_block_delta"), *delta = cJSON_CreateObject();
            cJSON_AddNumberToObject(bd, "index", i);
            cJSON_AddStringToObject(delta, "type",
                                    strcmp(field, "text") == 0 ? "text_delta" : "thinking_delta");
            cJSON_AddItemToObject(delta, field, cJSON_Duplicate(member(block, field), 1));
            cJSON_AddItemToObject(bd, "delta", delta);
            put_event(b, "content_block_delta", bd, NULL);
            cJSON_Delete(bd);
        } else if (tool) {
            char *json = cJSON_PrintUnformatted(member(block, "input"));
            cJSON *bd = typed("content_block_delta"), *delta = cJSON_CreateObject();
            if (!json || !bd || !delta) {
                free(json);
                cJSON_Delete(bd);
                cJSON_Delete(delta);
                b->oom = 1;
                return;
            }
            cJSON_AddNumberToObject(bd, "index", i);
            cJSON_AddStringToObject(delta, "type", "input_json_delta");
            cJSON_AddStringToObject(delta, "partial_json", json);
            free(json);
            cJSON_AddItemToObject(bd, "delta", delta);
            put_event(b, "content_block_delta", bd, NULL);
            cJSON_Delete(bd);
        }
        cJSON *stop = typed("content_block_stop");
        cJSON_AddNumberToObject(stop, "index", i);
        put_event(b, "content_block_stop", stop, NULL);
        cJSON_Delete(stop);
        i++;
    }
    cJSON *md = typed("message_delta"), *delta = cJSON_CreateObject(), *u = cJSON_CreateObject();
    const cJSON *sr = member(whole, "stop_reason"), *ss = member(whole, "stop_sequence");
    if (sr)
        cJSON_AddItemToObject(delta, "stop_reason", cJSON_Duplicate(sr, 1));
    if (ss)
        cJSON_AddItemToObject(delta, "stop_sequence", cJSON_Duplicate(ss, 1));
    cJSON_AddItemToObject(md, "delta", delta);
    const cJSON *ot = member(member(whole, "usage"), "output_tokens");
    if (ot)
        cJSON_AddItemToObject(u, "output_tokens", cJSON_Duplicate(ot, 1));
    if (member(whole, "usage"))
        cJSON_AddItemToObject(md, "usage", u);
    else
        cJSON_Delete(u); /* none recorded: none made up */
    put_event(b, "message_delta", md, NULL);
    cJSON_Delete(md);
    cJSON *stop = typed("message_stop");
    put_event(b, "message_stop", stop, NULL);
    cJSON_Delete(stop);
}

/* A Responses event of type `type` with its sequence number (*seq, counted on). */
static cJSON *seq_event(const char *type, int *seq)
{
    cJSON *e = typed(type);
    if (e)
        cJSON_AddNumberToObject(e, "sequence_number", (*seq)++);
    return e;
}

/* Puts e (owned: freed here) as an event of its own type. */
static void put_seq(struct sbuf *b, cJSON *e, const char *type)
{
    if (!e) {
        b->oom = 1;
        return;
    }
    put_event(b, type, e, NULL);
    cJSON_Delete(e);
}

/* The events a Responses stream of the whole answer carries, as OpenAI streams them:
 * response.created and response.in_progress (the response in progress, no output yet); each
 * output item added, a message's text parts added, their text as one delta and done, the item
 * done; then the terminal event with the whole response. A stream of the terminal event alone
 * broke clients that follow a stream (openai-python's `responses.stream()` wants
 * response.created first; a reader of the text deltas got none). */
static void synth_responses(struct sbuf *b, const cJSON *whole, const char *terminal)
{
    int seq = 0;
    static const char *const starts[] = {"response.created", "response.in_progress"};
    for (size_t s = 0; s < 2; s++) {
        cJSON *e = seq_event(starts[s], &seq), *r = cJSON_Duplicate(whole, 1);
        if (e && r) {
            cJSON_ReplaceItemInObject(r, "status", cJSON_CreateString("in_progress"));
            if (member(r, "output"))
                cJSON_ReplaceItemInObject(r, "output", cJSON_CreateArray());
            if (member(r, "usage"))
                cJSON_ReplaceItemInObject(r, "usage", cJSON_CreateNull());
            cJSON_AddItemToObject(e, "response", r);
        } else {
            cJSON_Delete(r);
            cJSON_Delete(e);
            e = NULL;
        }
        put_seq(b, e, starts[s]);
    }
    int oi = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, member(whole, "output"))
    {
        const char *kind = cJSON_GetStringValue(member(item, "type"));
        int message = kind && !strcmp(kind, "message");
        cJSON *e = seq_event("response.output_item.added", &seq), *it = cJSON_Duplicate(item, 1);
        if (e && it) {
            cJSON_AddNumberToObject(e, "output_index", oi);
            if (message && member(it, "content"))
                cJSON_ReplaceItemInObject(it, "content", cJSON_CreateArray());
            if (member(it, "status"))
                cJSON_ReplaceItemInObject(it, "status", cJSON_CreateString("in_progress"));
            cJSON_AddItemToObject(e, "item", it);
        } else {
            cJSON_Delete(it);
            cJSON_Delete(e);
            e = NULL;
        }
        put_seq(b, e, "response.output_item.added");
        const cJSON *part, *id = member(item, "id");
        const cJSON *parts = message ? member(item, "content") : NULL;
        int ci = 0;
        cJSON_ArrayForEach(part, parts)
        {
            const char *pt = cJSON_GetStringValue(member(part, "type"));
            const cJSON *text = member(part, "text");
            int is_text = pt && !strcmp(pt, "output_text") && cJSON_IsString(text);
            static const char *const steps[] = {"response.content_part.added",
                                                "response.output_text.delta",
                                                "response.output_text.done",
                                                "response.content_part.done"};
            for (size_t s = 0; s < 4; s++) {
                if ((s == 1 || s == 2) && !is_text)
                    continue;
                cJSON *ev = seq_event(steps[s], &seq);
                if (ev) {
                    if (id)
                        cJSON_AddItemToObject(ev, "item_id", cJSON_Duplicate(id, 1));
                    cJSON_AddNumberToObject(ev, "output_index", oi);
                    cJSON_AddNumberToObject(ev, "content_index", ci);
                    if (s == 1)
                        cJSON_AddItemToObject(ev, "delta", cJSON_Duplicate(text, 1));
                    else if (s == 2)
                        cJSON_AddItemToObject(ev, "text", cJSON_Duplicate(text, 1));
                    else {
                        cJSON *pp = cJSON_Duplicate(part, 1);
                        if (pp && s == 0 && is_text)
                            cJSON_ReplaceItemInObject(pp, "text", cJSON_CreateString(""));
                        cJSON_AddItemToObject(ev, "part", pp);
                    }
                }
                put_seq(b, ev, steps[s]);
            }
            ci++;
        }
        cJSON *done = seq_event("response.output_item.done", &seq);
        if (done) {
            cJSON_AddNumberToObject(done, "output_index", oi);
            cJSON_AddItemToObject(done, "item", cJSON_Duplicate(item, 1));
        }
        put_seq(b, done, "response.output_item.done");
        oi++;
    }
    cJSON *end = seq_event(terminal, &seq);
    if (end)
        cJSON_AddItemToObject(end, "response", cJSON_Duplicate(whole, 1));
    put_seq(b, end, terminal);
}

char *sse_synthesize(enum sse_format f, const char *json, size_t len, size_t *out_len)
{
    *out_len = 0;
    const char *end = NULL;
    cJSON *whole = json && len ? cJSON_ParseWithLengthOpts(json, len, &end, 0) : NULL;
    if (!cJSON_IsObject(whole) || end != json + len) {
        cJSON_Delete(whole);
        return NULL;
    }
    struct sbuf b = {0};
    if (f == SSE_OPENAI_CHAT && cJSON_IsArray(member(whole, "choices"))) {
        synth_chat(&b, whole);
    } else if (f == SSE_ANTHROPIC && cJSON_IsArray(member(whole, "content"))) {
        synth_anthropic(&b, whole);
    } else if (f == SSE_OPENAI_RESPONSES && cJSON_IsString(member(whole, "id"))) {
        /* An answer cut by the provider (max_output_tokens…) ends as it would have streamed. */
        const char *st = cJSON_GetStringValue(member(whole, "status"));
        synth_responses(&b, whole, st && !strcmp(st, "incomplete") ? "response.incomplete"
                                                                    : "response.completed");
    } else {
        b.oom = 1; /* not an answer of this format */
    }
    cJSON_Delete(whole);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *out_len = b.len;
    return b.p;
}
