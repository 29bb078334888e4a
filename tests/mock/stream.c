/*
 * idemgate-mock: LLM text, whole or streamed as server-sent events (stream.h).
 */
#include "stream.h"

#include "ledger.h"
#include "providers.h"
#include "reply.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum api { API_CHAT, API_MESSAGES, API_RESPONSES };

/* One stream being written: what was asked, and how far it got. */
struct sse_state {
    enum api api;
    unsigned long seq;
    int events;         /* text deltas */
    int delay_ms;
    int output_delay_ms; /* before the event after the preamble's first (a model that thinks) */
    int cut_after;      /* -1: never */
    int error_after;    /* -1: never */
    bool include_usage; /* OpenAI: stream_options.include_usage */
    bool reasoning;     /* OpenAI Chat: the deltas are reasoning_content */
    bool unterminated;  /* after the terminal event, closed without the chunked body's end */
    char error_code[65]; /* OpenAI Chat: the error chunk's code and type ("": server_error) */
    int prompt_tokens;
    int step;           /* events written so far */
    char pending[1024]; /* the event being written */
    size_t pending_len, pending_off;
    bool done;
};

/* Creates seen per body (its SHA-256), for "error_first": a small table, oldest entry reused. */
#define SEEN_MAX 1024
static struct {
    char sha[65];
    int n;
} seen[SEEN_MAX];
static size_t seen_next;
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;

/* How many creates with this body came before this one. */
static int creates_before(const char *sha)
{
    int n = 0;
    pthread_mutex_lock(&seen_lock);
    size_t i = 0;
    while (i < SEEN_MAX && strcmp(seen[i].sha, sha) != 0)
        i++;
    if (i == SEEN_MAX) {
        i = seen_next;
        seen_next = (seen_next + 1) % SEEN_MAX;
        snprintf(seen[i].sha, sizeof(seen[i].sha), "%s", sha);
        seen[i].n = 0;
    }
    n = seen[i].n++;
    pthread_mutex_unlock(&seen_lock);
    return n;
}

/* Responses the provider keeps (store, its default) for GET /v1/responses/{id}: what each
 * create asked, and how many reads still find it in progress ("reads_in_progress"). */
#define KEPT_MAX 4096
static struct {
    unsigned long seq; /* 0: free */
    int events, prompt_tokens, in_progress_reads;
    bool cancelled, failed;
    /* Created with "background": its stream may be resumed (GET ?stream=true&starting_after=n),
     * its events spaced by delay_ms; the first resume is cut again before event resume_cut
     * ("_mock.resume_cut_after"; -1: never). */
    bool background;
    int delay_ms, resume_cut;
} kept[KEPT_MAX];

/* A kept response whose stream ended with an error event: read back, it is failed. */
static void kept_failed(unsigned long seq)
{
    pthread_mutex_lock(&seen_lock);
    if (kept[seq % KEPT_MAX].seq == seq)
        kept[seq % KEPT_MAX].failed = true;
    pthread_mutex_unlock(&seen_lock);
}

static void keep_response(unsigned long seq, int events, int prompt_tokens, int in_progress,
                          bool background, int delay_ms, int resume_cut)
{
    pthread_mutex_lock(&seen_lock);
    size_t i = seq % KEPT_MAX;
    kept[i].seq = seq;
    kept[i].events = events;
    kept[i].prompt_tokens = prompt_tokens;
    kept[i].in_progress_reads = in_progress;
    kept[i].cancelled = false;
    kept[i].failed = false;
    kept[i].background = background;
    kept[i].delay_ms = delay_ms;
    kept[i].resume_cut = resume_cut;
    pthread_mutex_unlock(&seen_lock);
}

static int int_control(const cJSON *ctl, const char *name, int def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(ctl, name);
    return cJSON_IsNumber(v) ? v->valueint : def;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

    if (ms > 0)
        nanosleep(&ts, NULL);
}

/* Writes event number st->step (0-based) of the whole stream into st->pending. */
static void make_event(struct sse_state *st)
{
    int n = st->step, deltas = st->events;
    char *o = st->pending;
    size_t cap = sizeof(st->pending);
    int w = 0;

    if (st->error_after >= 0 && n == st->error_after) {
        if (st->api == API_MESSAGES)
            w = snprintf(o, cap, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":"
                                 "\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n");
        else if (st->api == API_RESPONSES) {
            w = snprintf(o, cap, "event: error\ndata: {\"type\":\"error\",\"code\":"
                                 "\"server_error\",\"message\":\"The server had an error\"}\n\n");
            kept_failed(st->seq);
        }
        else if (st->error_code[0])
            w = snprintf(o, cap, "data: {\"error\":{\"message\":\"mock error\",\"type\":\"%s\","
                                 "\"code\":\"%s\"}}\n\n",
                         st->error_code, st->error_code);
        else
            w = snprintf(o, cap, "data: {\"error\":{\"message\":\"The server had an error while "
                                 "processing your request.\",\"type\":\"server_error\"}}\n\n");
        st->done = true;
    } else if (st->api == API_RESPONSES) {
        /* created, in_progress, deltas, output_text.done, completed (with the whole response) */
        if (n == 0 || n == 1)
            w = snprintf(o, cap, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%d,"
                                 "\"response\":{\"id\":\"resp_%lu\",\"object\":\"response\","
                                 "\"status\":\"in_progress\",\"model\":\"mock-llm\",\"output\":[],"
                                 "\"usage\":null}}\n\n",
                         n ? "response.in_progress" : "response.created",
                         n ? "response.in_progress" : "response.created", n, st->seq);
        else if (n < 2 + deltas)
            w = snprintf(o, cap, "event: response.output_text.delta\ndata: {\"type\":"
                                 "\"response.output_text.delta\",\"sequence_number\":%d,"
                                 "\"item_id\":\"msg_%lu\",\"output_index\":0,\"content_index\":0,"
                                 "\"delta\":\"tok%d \"}\n\n",
                         n, st->seq, n - 2);
        else if (n == 2 + deltas)
            w = snprintf(o, cap, "event: response.output_text.done\ndata: {\"type\":"
                                 "\"response.output_text.done\",\"sequence_number\":%d,"
                                 "\"item_id\":\"msg_%lu\",\"output_index\":0,\"content_index\":0}\n\n",
                         n, st->seq);
        else {
            char text[512] = "";
            size_t t = 0;
            for (int i = 0; i < deltas && t + 16 < sizeof(text); i++)
                t += (size_t)snprintf(text + t, sizeof(text) - t, "tok%d ", i);
            w = snprintf(o, cap, "event: response.completed\ndata: {\"type\":\"response.completed\","
                                 "\"sequence_number\":%d,\"response\":{\"id\":\"resp_%lu\",\"object\":"
                                 "\"response\",\"status\":\"completed\",\"model\":\"mock-llm\","
                                 "\"output\":[{\"type\":\"message\",\"id\":\"msg_%lu\",\"status\":"
                                 "\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":"
                                 "\"output_text\",\"text\":\"%s\",\"annotations\":[]}]}],"
                                 "\"usage\":{\"input_tokens\":%d,\"output_tokens\":%d,"
                                 "\"total_tokens\":%d}}}\n\n",
                         n, st->seq, st->seq, text, st->prompt_tokens, deltas,
                         st->prompt_tokens + deltas);
            st->done = true;
        }
    } else if (st->api == API_CHAT) {
        /* role, deltas, finish, [usage], [DONE]; with include_usage every chunk before the
         * usage one says "usage": null, as OpenAI's do */
        const char *usage_null = st->include_usage ? ",\"usage\":null" : "";
        if (n == 0)
            w = snprintf(o, cap, "data: {\"id\":\"chatcmpl-%lu\",\"object\":\"chat.completion.chunk\","
                                 "\"model\":\"mock-llm\",\"choices\":[{\"index\":0,\"delta\":{\"role\":"
                                 "\"assistant\",\"content\":\"\"},\"finish_reason\":null}]%s}\n\n",
                         st->seq, usage_null);
        else if (n <= deltas)
            w = snprintf(o, cap, "data: {\"id\":\"chatcmpl-%lu\",\"object\":\"chat.completion.chunk\","
                                 "\"model\":\"mock-llm\",\"choices\":[{\"index\":0,\"delta\":{\"%s\":"
                                 "\"tok%d \"},\"finish_reason\":null}]%s}\n\n",
                         st->seq, st->reasoning ? "reasoning_content" : "content", n - 1, usage_null);
        else if (n == deltas + 1)
            w = snprintf(o, cap, "data: {\"id\":\"chatcmpl-%lu\",\"object\":\"chat.completion.chunk\","
                                 "\"model\":\"mock-llm\",\"choices\":[{\"index\":0,\"delta\":{},"
                                 "\"finish_reason\":\"stop\"}]%s}\n\n",
                         st->seq, usage_null);
        else if (n == deltas + 2 && st->include_usage)
            w = snprintf(o, cap, "data: {\"id\":\"chatcmpl-%lu\",\"object\":\"chat.completion.chunk\","
                                 "\"model\":\"mock-llm\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,"
                                 "\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n",
                         st->seq, st->prompt_tokens, deltas, st->prompt_tokens + deltas);
        else {
            w = snprintf(o, cap, "data: [DONE]\n\n");
            st->done = true;
        }
    } else {
        /* message_start, content_block_start, ping, deltas, content_block_stop, message_delta,
         * message_stop */
        if (n == 0)
            w = snprintf(o, cap, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":"
                                 "{\"id\":\"msg_%lu\",\"type\":\"message\",\"role\":\"assistant\","
                                 "\"content\":[],\"model\":\"mock-llm\",\"stop_reason\":null,\"usage\":"
                                 "{\"input_tokens\":%d,\"output_tokens\":1}}}\n\n",
                         st->seq, st->prompt_tokens);
        else if (n == 1)
            w = snprintf(o, cap, "event: content_block_start\ndata: {\"type\":\"content_block_start\","
                                 "\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
        else if (n == 2)
            w = snprintf(o, cap, "event: ping\ndata: {\"type\": \"ping\"}\n\n");
        else if (n < 3 + deltas)
            w = snprintf(o, cap, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\","
                                 "\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"tok%d \"}}\n\n",
                         n - 3);
        else if (n == 3 + deltas)
            w = snprintf(o, cap, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\","
                                 "\"index\":0}\n\n");
        else if (n == 4 + deltas)
            w = snprintf(o, cap, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":"
                                 "{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":"
                                 "{\"output_tokens\":%d}}\n\n",
                         deltas);
        else {
            w = snprintf(o, cap, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
            st->done = true;
        }
    }
    st->pending_len = w > 0 && (size_t)w < cap ? (size_t)w : 0;
    st->pending_off = 0;
    st->step++;
}

static ssize_t read_events(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct sse_state *st = cls;

    (void)pos;
    if (st->pending_off == st->pending_len) {
        if (st->done)
            return st->unterminated ? MHD_CONTENT_READER_END_WITH_ERROR
                                    : MHD_CONTENT_READER_END_OF_STREAM;
        if (st->cut_after >= 0 && st->step >= st->cut_after)
            return MHD_CONTENT_READER_END_WITH_ERROR; /* closed with no terminal event */
        sleep_ms(st->step == 1 && st->output_delay_ms ? st->output_delay_ms : st->delay_ms);
        if (mock_shutting_down())
            return MHD_CONTENT_READER_END_WITH_ERROR;
        make_event(st);
    }
    size_t n = st->pending_len - st->pending_off;
    if (n > max)
        n = max;
    memcpy(buf, st->pending + st->pending_off, n);
    st->pending_off += n;
    return (ssize_t)n;
}

static enum MHD_Result whole_answer(struct mock_request *req, enum api api, unsigned long seq,
                                    int deltas, int prompt_tokens)
{
    char text[512] = "";
    size_t o = 0;
    cJSON *doc = cJSON_CreateObject(), *usage = cJSON_CreateObject();

    for (int i = 0; i < deltas && o + 16 < sizeof(text); i++)
        o += (size_t)snprintf(text + o, sizeof(text) - o, "tok%d ", i);
    if (doc == NULL || usage == NULL) {
        cJSON_Delete(doc);
        cJSON_Delete(usage);
        return reply_error(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory", "mock_error",
                           "oom");
    }
    char id[48];
    if (api == API_CHAT) {
        snprintf(id, sizeof(id), "chatcmpl-%lu", seq);
        cJSON_AddStringToObject(doc, "id", id);
        cJSON_AddStringToObject(doc, "object", "chat.completion");
        cJSON_AddStringToObject(doc, "model", "mock-llm");
        cJSON *choices = cJSON_AddArrayToObject(doc, "choices");
        cJSON *c = cJSON_CreateObject(), *m = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", 0);
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", text);
        cJSON_AddItemToObject(c, "message", m);
        cJSON_AddStringToObject(c, "finish_reason", "stop");
        cJSON_AddItemToArray(choices, c);
        cJSON_AddNumberToObject(usage, "prompt_tokens", prompt_tokens);
        cJSON_AddNumberToObject(usage, "completion_tokens", deltas);
        cJSON_AddNumberToObject(usage, "total_tokens", prompt_tokens + deltas);
    } else if (api == API_RESPONSES) {
        snprintf(id, sizeof(id), "resp_%lu", seq);
        cJSON_AddStringToObject(doc, "id", id);
        cJSON_AddStringToObject(doc, "object", "response");
        cJSON_AddStringToObject(doc, "status", "completed");
        cJSON_AddStringToObject(doc, "model", "mock-llm");
        cJSON *output = cJSON_AddArrayToObject(doc, "output");
        cJSON *msg = cJSON_CreateObject(), *content = cJSON_CreateArray(), *part = cJSON_CreateObject();
        cJSON_AddStringToObject(msg, "type", "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddStringToObject(part, "type", "output_text");
        cJSON_AddStringToObject(part, "text", text);
        cJSON_AddItemToArray(content, part);
        cJSON_AddItemToObject(msg, "content", content);
        cJSON_AddItemToArray(output, msg);
        cJSON_AddNumberToObject(usage, "input_tokens", prompt_tokens);
        cJSON_AddNumberToObject(usage, "output_tokens", deltas);
        cJSON_AddNumberToObject(usage, "total_tokens", prompt_tokens + deltas);
    } else {
        snprintf(id, sizeof(id), "msg_%lu", seq);
        cJSON_AddStringToObject(doc, "id", id);
        cJSON_AddStringToObject(doc, "type", "message");
        cJSON_AddStringToObject(doc, "role", "assistant");
        cJSON_AddStringToObject(doc, "model", "mock-llm");
        cJSON *content = cJSON_AddArrayToObject(doc, "content");
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", text);
        cJSON_AddItemToArray(content, b);
        cJSON_AddStringToObject(doc, "stop_reason", "end_turn");
        cJSON_AddNumberToObject(usage, "input_tokens", prompt_tokens);
        cJSON_AddNumberToObject(usage, "output_tokens", deltas);
    }
    cJSON_AddItemToObject(doc, "usage", usage);
    return reply_json(req, MHD_HTTP_OK, doc);
}

/* A Responses object still going: status "queued" or "in_progress", no output yet. */
static enum MHD_Result response_in_progress(struct mock_request *req, unsigned long seq,
                                            const char *status)
{
    cJSON *doc = cJSON_CreateObject();
    char rid[48];
    snprintf(rid, sizeof(rid), "resp_%lu", seq);
    cJSON_AddStringToObject(doc, "id", rid);
    cJSON_AddStringToObject(doc, "object", "response");
    cJSON_AddStringToObject(doc, "status", status);
    cJSON_AddBoolToObject(doc, "background", 1);
    cJSON_AddArrayToObject(doc, "output");
    cJSON_AddNullToObject(doc, "usage");
    return reply_json(req, MHD_HTTP_OK, doc);
}

/* Answers with the events of st (freed with the response). */
static enum MHD_Result send_events(struct mock_request *req, struct sse_state *st)
{
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 1024, read_events, st, free);
    if (resp == NULL) {
        free(st);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    return reply_queue(req, MHD_HTTP_OK, resp);
}

static enum MHD_Result handle(struct mock_request *req, enum api api)
{
    struct ledger_record rec = {0};
    struct ledger_slot slot = {0};
    cJSON *doc = cJSON_ParseWithLength(req->body, req->body_len);
    const cJSON *ctl = cJSON_GetObjectItemCaseSensitive(doc, "_mock");
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(doc, "stream_options");
    bool stream = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "stream"));
    int status = int_control(ctl, "status", 200);
    enum MHD_Result ret;

    rec.route = req->url;
    rec.provider = api == API_CHAT ? "openai-chat" : api == API_MESSAGES ? "anthropic"
                                                                        : "openai-responses";
    rec.idempotency_key =
        MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Idempotency-Key");
    rec.content_type = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Content-Type");
    mock_sha256_hex(req->body, req->body_len, rec.body_sha256);
    if (!cJSON_IsObject(doc))
        status = MHD_HTTP_BAD_REQUEST;
    if (api == API_MESSAGES &&
        MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "anthropic-version") == NULL)
        status = MHD_HTTP_BAD_REQUEST;
    if (api == API_RESPONSES && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "background")) &&
        cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(doc, "store")))
        status = MHD_HTTP_BAD_REQUEST; /* background needs store */
    rec.status = status;
    rec.replay = status < 200 || status >= 300; /* an error answer starts no generation */
    if (!ledger_append(&rec, &slot)) {
        cJSON_Delete(doc);
        return reply_error(req, MHD_HTTP_INSUFFICIENT_STORAGE, "mock ledger is full",
                           "mock_error", "ledger_full");
    }
    int deltas = int_control(ctl, "events", 3);
    int prompt_tokens = (int)(req->body_len / 4) + 1;
    if (api == API_RESPONSES && status == 200 &&
        !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(doc, "store")))
    {
        keep_response(slot.seq, deltas, prompt_tokens, int_control(ctl, "reads_in_progress", 0),
                      cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "background")),
                      int_control(ctl, "event_delay_ms", 0),
                      int_control(ctl, "resume_cut_after", -1));
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ctl, "fail")))
            kept_failed(slot.seq);
    }
    if (status != 200) {
        cJSON_Delete(doc);
        if (status == 429 || status == 529) {
            struct mock_reply r;
            reply_init(&r);
            if (!reply_set_error(&r, (unsigned)status, "Overloaded, try again", "overloaded_error",
                                 "overloaded"))
                return MHD_NO;
            snprintf(r.retry_after, sizeof(r.retry_after), "0");
            ret = reply_send(req, &r);
            reply_free(&r);
            return ret;
        }
        return reply_error(req, (unsigned)status, "invalid request", "invalid_request_error",
                           "invalid_request");
    }
    if (!stream && api == API_RESPONSES &&
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "background"))) {
        /* Answered at once, queued; read back by GET /v1/responses/{id} (kept above). */
        cJSON_Delete(doc);
        return response_in_progress(req, slot.seq, "queued");
    }
    if (!stream) {
        ret = whole_answer(req, api, slot.seq, deltas, prompt_tokens);
        cJSON_Delete(doc);
        return ret;
    }
    struct sse_state *st = calloc(1, sizeof(*st));
    if (st == NULL) {
        cJSON_Delete(doc);
        return MHD_NO;
    }
    st->api = api;
    st->seq = slot.seq;
    st->events = deltas;
    st->delay_ms = int_control(ctl, "event_delay_ms", 0);
    st->output_delay_ms = int_control(ctl, "output_delay_ms", 0);
    st->cut_after = int_control(ctl, "cut_after", -1);
    st->error_after = int_control(ctl, "error_after", -1);
    st->reasoning = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ctl, "reasoning"));
    st->unterminated = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ctl, "unterminated"));
    const char *code = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ctl, "error_code"));
    if (code && *code && strlen(code) < sizeof(st->error_code) &&
        strspn(code, "abcdefghijklmnopqrstuvwxyz_") == strlen(code))
        snprintf(st->error_code, sizeof(st->error_code), "%s", code);
    /* The first N creates of this body: an error event right after the stream's preamble
     * (message_start; the role chunk; response.created and response.in_progress), before any
     * output. */
    int error_first = int_control(ctl, "error_first", 0);
    if (error_first > 0 && creates_before(rec.body_sha256) < error_first)
        st->error_after = api == API_RESPONSES ? 2 : 1;
    st->include_usage = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(so, "include_usage"));
    st->prompt_tokens = prompt_tokens;
    cJSON_Delete(doc);
    return send_events(req, st);
}

enum MHD_Result stream_handle_chat(struct mock_request *req)
{
    return handle(req, API_CHAT);
}

enum MHD_Result stream_handle_messages(struct mock_request *req)
{
    return handle(req, API_MESSAGES);
}

enum MHD_Result stream_handle_responses(struct mock_request *req)
{
    return handle(req, API_RESPONSES);
}

void stream_reset(void)
{
    pthread_mutex_lock(&seen_lock);
    memset(kept, 0, sizeof(kept));
    memset(seen, 0, sizeof(seen));
    seen_next = 0;
    pthread_mutex_unlock(&seen_lock);
}

/* GET /v1/responses/{id}: a kept response, whole once its reads in progress are spent (the
 * provider went on generating after the stream was cut); 404 for one never kept. */
enum MHD_Result stream_handle_response_get(struct mock_request *req)
{
    const char *id = req->url + strlen("/v1/responses/");
    char *end = NULL;
    unsigned long seq = strncmp(id, "resp_", 5) == 0 ? strtoul(id + 5, &end, 10) : 0;
    int found = 0, events = 0, prompt_tokens = 0, running = 0, cancelled = 0, failed = 0;
    int background = 0, delay_ms = 0, resume_cut = -1;
    bool cancel = strcmp(req->method, "POST") == 0;
    const char *sv = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "stream");
    const char *after = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND,
                                                    "starting_after");
    bool resume = !cancel && sv && strcmp(sv, "true") == 0;

    if (seq && end && (cancel ? strcmp(end, "/cancel") == 0 : *end == '\0')) {
        pthread_mutex_lock(&seen_lock);
        size_t i = seq % KEPT_MAX;
        if (kept[i].seq == seq) {
            found = 1;
            events = kept[i].events;
            prompt_tokens = kept[i].prompt_tokens;
            running = kept[i].in_progress_reads > 0;
            if (cancel && running) /* only a response still going is cancelled */
                kept[i].cancelled = true;
            cancelled = kept[i].cancelled;
            failed = kept[i].failed;
            if (running && !cancel && !resume)
                kept[i].in_progress_reads--;
            background = kept[i].background;
            delay_ms = kept[i].delay_ms;
            resume_cut = kept[i].resume_cut;
            if (resume)
                kept[i].resume_cut = -1; /* the next resume goes to the end */
        }
        pthread_mutex_unlock(&seen_lock);
    }
    if (!found)
        return reply_error(req, MHD_HTTP_NOT_FOUND, "Response not found",
                           "invalid_request_error", "not_found");
    if (resume) {
        /* The events after number starting_after (from the start without it), as the stream
         * of the create went on: only a background response can be streamed again. */
        if (!background)
            return reply_error(req, MHD_HTTP_BAD_REQUEST,
                               "Only responses created with background can be streamed again",
                               "invalid_request_error", "invalid_request");
        struct sse_state *st = calloc(1, sizeof(*st));
        if (st == NULL)
            return MHD_NO;
        st->api = API_RESPONSES;
        st->seq = seq;
        st->events = events;
        st->prompt_tokens = prompt_tokens;
        st->delay_ms = delay_ms;
        st->cut_after = resume_cut;
        st->step = after ? atoi(after) + 1 : 0;
        st->error_after = failed ? st->step : -1; /* a failed response: its error event next */
        /* After the terminal event (response.completed is number 3 + events) there is nothing
         * more: an empty event stream, as OpenAI's. */
        st->done = !failed && st->step > 3 + events;
        return send_events(req, st);
    }
    if (cancelled)
        return response_in_progress(req, seq, "cancelled");
    if (failed && !running)
        return response_in_progress(req, seq, "failed");
    if (!running)
        return whole_answer(req, API_RESPONSES, seq, events, prompt_tokens);
    return response_in_progress(req, seq, "in_progress");
}
