/*
 * idemgate-mock: behaviour controls, the fault table and the fault script queue
 * (see faults.h).
 */
#include "faults.h"

#include <errno.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

/* How long "hang" holds a connection before closing it, in milliseconds. */
#define HANG_MS (600u * 1000u)

/* Upper bound of any delay, so a typo cannot park a connection thread for days. */
#define MAX_DELAY_MS (600u * 1000u)

/* Most outputs a create can return, matching the clamp of the request's "n". */
#define MAX_N_OUT 10u

/* Most entries the script queue holds, so a runaway test cannot exhaust memory. */
#define SCRIPT_MAX 100000u

/* Most status reads a task may wait for before it ends. */
#define MAX_POLLS 100000u

/* Most outputs an asynchronous task may produce. */
#define MAX_OUTPUTS 10u

/* Most extra copies of one webhook event. */
#define MAX_DUPLICATES 1000u

/* ---- Fault delivery ---------------------------------------------------------------- */

/*
 * Never answers: holds the connection until HANG_MS passed, the client went away or the
 * mock shuts down, then closes it without a response.
 */
static enum MHD_Result deliver_hang(struct mock_request *req, const struct mock_reply *r)
{
    (void)r;
    mock_sleep_ms(req, HANG_MS, true);
    return MHD_NO;
}

/*
 * Closes the connection without a response.  Returning MHD_NO after the body has been
 * read makes libmicrohttpd close the socket with an orderly FIN.
 */
static enum MHD_Result deliver_close(struct mock_request *req, const struct mock_reply *r)
{
    (void)req;
    (void)r;
    return MHD_NO;
}

/*
 * Aborts the connection with a TCP RST.  A zero linger time turns the close that follows
 * into an abortive one, and disconnecting the socket right away sends the RST before
 * libmicrohttpd gets a chance to shut the write side down with a FIN, which clients would
 * report as an empty reply instead of a reset.
 */
static enum MHD_Result deliver_reset(struct mock_request *req, const struct mock_reply *r)
{
    const union MHD_ConnectionInfo *info;
    struct linger lin = {.l_onoff = 1, .l_linger = 0};
    struct sockaddr unspec = {.sa_family = AF_UNSPEC};

    (void)r;
    info = MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info != NULL) {
        if (setsockopt(info->connect_fd, SOL_SOCKET, SO_LINGER, &lin, sizeof(lin)) != 0)
            fprintf(stderr, "idemgate-mock: SO_LINGER: %s\n", strerror(errno));
        /*
         * Linux treats connect() to AF_UNSPEC as "disconnect", which resets an established
         * TCP connection while the descriptor stays open and owned by libmicrohttpd.
         */
        if (connect(info->connect_fd, &unspec, sizeof(unspec)) != 0)
            fprintf(stderr, "idemgate-mock: disconnect: %s\n", strerror(errno));
    }
    return MHD_NO;
}

/*
 * Answers normally.  The slowness of "slow_headers" is its default delay, which the
 * create pipeline sleeps before delivering, so nothing at all is sent during it.
 */
static enum MHD_Result deliver_normal(struct mock_request *req, const struct mock_reply *r)
{
    return reply_send(req, r);
}

/* The body of a truncated response: the full text and how much of it is really sent. */
struct truncated_body {
    char *data;
    size_t cut;
};

/*
 * libmicrohttpd content reader for "truncate": hands out bytes up to the cut and then
 * reports an error, which makes libmicrohttpd close the connection although the declared
 * Content-Length promised more.
 */
static ssize_t truncated_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    const struct truncated_body *t = cls;
    size_t n;

    if (pos >= t->cut)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    n = t->cut - (size_t)pos;
    if (n > max)
        n = max;
    memcpy(buf, t->data + pos, n);
    return (ssize_t)n;
}

/* Frees a truncated_body once libmicrohttpd is done with the response. */
static void truncated_free(void *cls)
{
    struct truncated_body *t = cls;

    free(t->data);
    free(t);
}

/*
 * Sends the status line, the headers and a Content-Length for the whole body, but only the
 * first half of the body, then closes the connection.
 */
static enum MHD_Result deliver_truncate(struct mock_request *req, const struct mock_reply *r)
{
    struct truncated_body *t = malloc(sizeof(*t));
    struct MHD_Response *resp;

    if (t == NULL)
        return MHD_NO;
    t->data = malloc(r->body_len + 1);
    if (t->data == NULL) {
        free(t);
        return MHD_NO;
    }
    memcpy(t->data, r->body ? r->body : "", r->body_len);
    t->cut = r->body_len / 2;
    resp = MHD_create_response_from_callback(r->body_len, 4096, truncated_read, t, truncated_free);
    if (resp == NULL) {
        truncated_free(t);
        return MHD_NO;
    }
    reply_add_headers(resp, r);
    return reply_queue(req, r->status, resp);
}

/* What "html" answers in place of the provider's JSON: an egress proxy's or a CDN's page. */
static const char html_page[] = "<html><head><title>Notice</title></head>"
                                "<body><p>This request was inspected and forwarded.</p></body></html>";

/*
 * Answers the reply's status (the task was made: a 2xx) with an HTML page instead of its JSON
 * body, as an egress proxy or a CDN in front of the provider may.
 */
static enum MHD_Result deliver_html(struct mock_request *req, const struct mock_reply *r)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        sizeof(html_page) - 1, (void *)html_page, MHD_RESPMEM_PERSISTENT);
    if (resp == NULL)
        return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "text/html; charset=utf-8");
    return reply_queue(req, r->status, resp);
}

/* How long after its answer "stray" writes its extra bytes, in milliseconds. */
#define STRAY_AFTER_MS 100u

/* What "stray" writes onto the idle connection: a whole answer nobody asked for. A client
 * that sends its next request on this connection and reads this as its answer takes a
 * refusal ("not made") for a request the provider did receive. */
static const char stray_bytes[] = "HTTP/1.1 429 Too Many Requests\r\n"
                                  "Content-Length: 0\r\n"
                                  "Retry-After: 0\r\n\r\n";

static void *stray_later(void *arg)
{
    int fd = (int)(intptr_t)arg;
    struct timespec ts = {.tv_sec = 0, .tv_nsec = STRAY_AFTER_MS * 1000000L};
    nanosleep(&ts, NULL);
    if (send(fd, stray_bytes, sizeof(stray_bytes) - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
        fprintf(stderr, "idemgate-mock: stray: %s\n", strerror(errno));
    return NULL;
}

/*
 * Answers normally, then, STRAY_AFTER_MS later, writes a second answer onto the connection
 * it left idle and alive (written past libmicrohttpd, which waits for the next request). The
 * connection must stay open that long: a test sends nothing else on it meanwhile.
 */
static enum MHD_Result deliver_stray(struct mock_request *req, const struct mock_reply *r)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    enum MHD_Result ret = reply_send(req, r);
    pthread_t t;
    if (ret == MHD_YES && info != NULL &&
        pthread_create(&t, NULL, stray_later, (void *)(intptr_t)info->connect_fd) == 0)
        pthread_detach(t);
    return ret;
}

/* Every fault the mock knows; a new fault is one more row. */
static const struct mock_fault fault_table[] = {
    {"hang", 0, false, deliver_hang},             /* the client gives up, the task lives */
    {"close", 0, false, deliver_close},           /* an empty reply (FIN, no bytes) */
    {"reset", 0, false, deliver_reset},           /* a connection reset (RST) */
    {"slow_headers", 2000, true, deliver_normal}, /* nothing at all until the delay ends */
    {"truncate", 0, true, deliver_truncate},      /* a body shorter than its length */
    {"stray", 0, true, deliver_stray},            /* an answer, then a second one unasked */
    {"html", 0, true, deliver_html},              /* its status, an HTML page for a body */
};

/* Returns the fault called name, or NULL when there is none. */
const struct mock_fault *faults_find(const char *name)
{
    for (size_t i = 0; i < sizeof(fault_table) / sizeof(fault_table[0]); i++)
        if (strcmp(fault_table[i].name, name) == 0)
            return &fault_table[i];
    return NULL;
}

/* ---- Control parsing --------------------------------------------------------------- */

/*
 * Parses text as a plain decimal integer within [min, max] into *out.  Returns false on
 * anything else, including signs, spaces and trailing characters.
 */
static bool parse_uint(const char *text, unsigned long min, unsigned long max, unsigned int *out)
{
    char *end;
    unsigned long v;

    if (text[0] < '0' || text[0] > '9')
        return false;
    errno = 0;
    v = strtoul(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return false;
    *out = (unsigned int)v;
    return true;
}

/* Parses delay_ms: milliseconds to wait before answering, 0..MAX_DELAY_MS. */
static bool parse_delay(const char *text, struct mock_controls *c, char *err)
{
    if (parse_uint(text, 0, MAX_DELAY_MS, &c->delay_ms))
        return true;
    snprintf(err, FAULTS_ERR_MAX, "delay_ms must be an integer 0..%u", MAX_DELAY_MS);
    return false;
}

/*
 * Parses status: the HTTP status to answer with, 200..599.  Informational 1xx codes are
 * refused because they are not final answers and would leave a client waiting.
 */
static bool parse_status(const char *text, struct mock_controls *c, char *err)
{
    if (parse_uint(text, 200, 599, &c->status))
        return true;
    snprintf(err, FAULTS_ERR_MAX, "status must be an integer 200..599");
    return false;
}

/* Parses fault: the name of a row of fault_table. */
static bool parse_fault(const char *text, struct mock_controls *c, char *err)
{
    c->fault = faults_find(text);
    if (c->fault)
        return true;
    snprintf(err, FAULTS_ERR_MAX, "unknown fault \"%.60s\"", text);
    return false;
}

/* Parses n_out: how many outputs a successful create returns, 0..MAX_N_OUT. */
static bool parse_n_out(const char *text, struct mock_controls *c, char *err)
{
    if (parse_uint(text, 0, MAX_N_OUT, &c->n_out))
        return true;
    snprintf(err, FAULTS_ERR_MAX, "n_out must be an integer 0..%u", MAX_N_OUT);
    return false;
}

/*
 * Parses retry_after: sent verbatim as Retry-After, so it must fit the buffer and must not
 * contain control characters that would break the header.
 */
static bool parse_retry_after(const char *text, struct mock_controls *c, char *err)
{
    size_t len = strlen(text);

    for (size_t i = 0; i < len; i++) {
        if ((unsigned char)text[i] < 0x20 || text[i] == 0x7f) {
            snprintf(err, FAULTS_ERR_MAX, "retry_after must not contain control characters");
            return false;
        }
    }
    if (len == 0 || len >= sizeof(c->retry_after)) {
        snprintf(err, FAULTS_ERR_MAX, "retry_after must be 1..%zu characters",
                 sizeof(c->retry_after) - 1);
        return false;
    }
    memcpy(c->retry_after, text, len + 1);
    return true;
}

/* Parses polls: status reads before an asynchronous task ends, 0..MAX_POLLS. */
static bool parse_polls(const char *text, struct mock_controls *c, char *err)
{
    if (parse_uint(text, 0, MAX_POLLS, &c->polls))
        return true;
    snprintf(err, FAULTS_ERR_MAX, "polls must be an integer 0..%u", MAX_POLLS);
    return false;
}

/* Parses poll_delay_ms: how long a status read's answer waits once the task was read. */
static bool parse_poll_delay(const char *text, struct mock_controls *c, char *err)
{
    if (parse_uint(text, 0, MAX_DELAY_MS, &c->poll_delay_ms))
        return true;
    snprintf(err, FAULTS_ERR_MAX, "poll_delay_ms must be an integer 0..%u", MAX_DELAY_MS);
    return false;
}

/* Parses cancel_fails: how many of the task's first cancels answer 503 and cancel nothing. */
static bool parse_cancel_fails(const char *text, struct mock_controls *c, char *err)
{
    if (parse_uint(text, 0, 100, &c->cancel_fails))
        return true;
    snprintf(err, FAULTS_ERR_MAX, "cancel_fails must be an integer 0..100");
    return false;
}

/* Parses reads_fail_after_cancel: how many status reads after the task's first cancel (that
 * cancelled, or deleted, it) answer 503 before the task is shown again (or its 404, deleted). */
static bool parse_reads_fail(const char *text, struct mock_controls *c, char *err)
{
    if (parse_uint(text, 0, 100, &c->reads_fail_after_cancel))
        return true;
    snprintf(err, FAULTS_ERR_MAX, "reads_fail_after_cancel must be an integer 0..100");
    return false;
}

/* Parses outcome: how an asynchronous task ends, "succeeded" or "failed". */
static bool parse_outcome(const char *text, struct mock_controls *c, char *err)
{
    if (strcmp(text, "succeeded") == 0 || strcmp(text, "failed") == 0) {
        c->fail = text[0] == 'f';
        return true;
    }
    snprintf(err, FAULTS_ERR_MAX, "outcome must be \"succeeded\" or \"failed\"");
    return false;
}

/* Parses error: the failure message of an asynchronous task, 1..MOCK_ERROR_MAX-1 bytes. */
static bool parse_error_text(const char *text, struct mock_controls *c, char *err)
{
    size_t len = strlen(text);

    if (len == 0 || len >= sizeof(c->error)) {
        snprintf(err, FAULTS_ERR_MAX, "error must be 1..%zu characters", sizeof(c->error) - 1);
        return false;
    }
    memcpy(c->error, text, len + 1);
    return true;
}

/* Parses outputs: how many outputs a successful asynchronous task has, 0..MAX_OUTPUTS. */
static bool parse_outputs(const char *text, struct mock_controls *c, char *err)
{
    if (parse_uint(text, 0, MAX_OUTPUTS, &c->outputs))
        return true;
    snprintf(err, FAULTS_ERR_MAX, "outputs must be an integer 0..%u", MAX_OUTPUTS);
    return false;
}

/* Parses filtered: how many outputs a successful task withheld, 0..MAX_OUTPUTS. */
static bool parse_filtered(const char *text, struct mock_controls *c, char *err)
{
    if (parse_uint(text, 0, MAX_OUTPUTS, &c->filtered))
        return true;
    snprintf(err, FAULTS_ERR_MAX, "filtered must be an integer 0..%u", MAX_OUTPUTS);
    return false;
}

/*
 * Parses a boolean control: "true" or "1" turn it on, "false" or "0" off.  A JSON true or
 * false reaches the parsers as the words.
 */
static bool parse_flag(const char *text, const char *name, bool *out, char *err)
{
    if (strcmp(text, "true") == 0 || strcmp(text, "1") == 0) {
        *out = true;
        return true;
    }
    if (strcmp(text, "false") == 0 || strcmp(text, "0") == 0) {
        *out = false;
        return true;
    }
    snprintf(err, FAULTS_ERR_MAX, "%s must be true or false", name);
    return false;
}

/* Parses task_made: with an error status, the task is made all the same. */
static bool parse_task_made(const char *text, struct mock_controls *c, char *err)
{
    return parse_flag(text, "task_made", &c->task_made, err);
}

/* Parses visible_after_ms: how long the task stays out of sight, 0..MAX_DELAY_MS. */
static bool parse_visible_after(const char *text, struct mock_controls *c, char *err)
{
    if (parse_uint(text, 0, MAX_DELAY_MS, &c->visible_after_ms))
        return true;
    snprintf(err, FAULTS_ERR_MAX, "visible_after_ms must be an integer 0..%u", MAX_DELAY_MS);
    return false;
}

/* Parses pad_bytes: the size of the "pad" member of a 2xx create body, 0..MOCK_PAD_MAX. */
static bool parse_pad(const char *text, struct mock_controls *c, char *err)
{
    if (parse_uint(text, 0, MOCK_PAD_MAX, &c->pad_bytes))
        return true;
    snprintf(err, FAULTS_ERR_MAX, "pad_bytes must be an integer 0..%u", MOCK_PAD_MAX);
    return false;
}

/* Parses id_numeric: the task id is a JSON integer above 2^53 (keyed-async). */
static bool parse_id_numeric(const char *text, struct mock_controls *c, char *err)
{
    return parse_flag(text, "id_numeric", &c->id_numeric, err);
}

/* Parses id_missing: the create's 2xx answer has no id (keyed-async). */
static bool parse_id_missing(const char *text, struct mock_controls *c, char *err)
{
    return parse_flag(text, "id_missing", &c->id_missing, err);
}

/* Reads a JSON integer within [0, max] into *out; false on anything else. */
static bool json_uint(const cJSON *v, unsigned int max, unsigned int *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > max ||
        v->valuedouble != (double)(unsigned int)v->valuedouble)
        return false;
    *out = (unsigned int)v->valuedouble;
    return true;
}

/*
 * Parses the webhook object {"url", "duplicates", "delay_ms", "auto_complete_ms", "early",
 * "reorder", "bad_signature"}; every key is optional and unknown keys are refused.
 */
static bool parse_webhook_json(const cJSON *obj, struct mock_controls *c, char *err)
{
    struct mock_webhook_controls *w = &c->webhook;
    const cJSON *item;

    memset(w, 0, sizeof(*w));
    if (!cJSON_IsObject(obj)) {
        snprintf(err, FAULTS_ERR_MAX, "webhook must be a JSON object");
        return false;
    }
    cJSON_ArrayForEach(item, obj)
    {
        const char *k = item->string;
        bool ok;

        if (strcmp(k, "url") == 0) {
            ok = cJSON_IsString(item) && strlen(item->valuestring) < sizeof(w->url) &&
                 (strncmp(item->valuestring, "http://", 7) == 0 ||
                  strncmp(item->valuestring, "https://", 8) == 0);
            if (ok)
                strcpy(w->url, item->valuestring);
        } else if (strcmp(k, "duplicates") == 0) {
            ok = json_uint(item, MAX_DUPLICATES, &w->duplicates);
        } else if (strcmp(k, "delay_ms") == 0) {
            ok = json_uint(item, MAX_DELAY_MS, &w->delay_ms);
        } else if (strcmp(k, "auto_complete_ms") == 0) {
            ok = json_uint(item, MAX_DELAY_MS, &w->auto_complete_ms);
            w->has_auto_complete = ok;
        } else if (strcmp(k, "early") == 0 || strcmp(k, "reorder") == 0 ||
                   strcmp(k, "bad_signature") == 0) {
            bool *flag = k[0] == 'e' ? &w->early : k[0] == 'r' ? &w->reorder : &w->bad_signature;

            ok = cJSON_IsBool(item);
            *flag = cJSON_IsTrue(item);
        } else {
            snprintf(err, FAULTS_ERR_MAX, "unknown webhook control \"%.60s\"", k);
            return false;
        }
        if (!ok) {
            snprintf(err, FAULTS_ERR_MAX,
                     "webhook.%.20s: url is an http(s) URL under %u bytes, duplicates 0..%u, "
                     "delay_ms and auto_complete_ms 0..%u, the rest true or false",
                     k, MOCK_URL_MAX, MAX_DUPLICATES, MAX_DELAY_MS);
            return false;
        }
    }
    return true;
}

/* Parses the X-Mock-Webhook header: the same object as "_mock.webhook", as JSON text. */
static bool parse_webhook_text(const char *text, struct mock_controls *c, char *err)
{
    cJSON *doc = cJSON_Parse(text);
    bool ok = parse_webhook_json(doc, c, err);

    cJSON_Delete(doc);
    return ok;
}

/* One control: its "_mock" key, its request header and how its text is parsed. */
struct control_field {
    const char *json_name;
    const char *header_name;
    unsigned int bit;
    bool (*parse)(const char *text, struct mock_controls *c, char *err);
    /* For a control whose JSON value is an object: parses that value; NULL for the rest. */
    bool (*parse_json)(const cJSON *v, struct mock_controls *c, char *err);
};

/* Every control the mock understands; a new control is one more row. */
static const struct control_field field_table[] = {
    {"delay_ms", "X-Mock-Delay-Ms", CTRL_DELAY, parse_delay, NULL},
    {"status", "X-Mock-Status", CTRL_STATUS, parse_status, NULL},
    {"fault", "X-Mock-Fault", CTRL_FAULT, parse_fault, NULL},
    {"n_out", "X-Mock-N-Out", CTRL_N_OUT, parse_n_out, NULL},
    {"retry_after", "X-Mock-Retry-After", CTRL_RETRY_AFTER, parse_retry_after, NULL},
    {"task_made", "X-Mock-Task-Made", CTRL_TASK_MADE, parse_task_made, NULL},
    {"visible_after_ms", "X-Mock-Visible-After-Ms", CTRL_VISIBLE_AFTER, parse_visible_after, NULL},
    {"pad_bytes", "X-Mock-Pad-Bytes", CTRL_PAD, parse_pad, NULL},
    /* The rest apply to asynchronous providers only. */
    {"polls", "X-Mock-Polls", CTRL_POLLS, parse_polls, NULL},
    {"poll_delay_ms", "X-Mock-Poll-Delay-Ms", CTRL_POLL_DELAY, parse_poll_delay, NULL},
    {"cancel_fails", "X-Mock-Cancel-Fails", CTRL_CANCEL_FAILS, parse_cancel_fails, NULL},
    {"reads_fail_after_cancel", "X-Mock-Reads-Fail-After-Cancel", CTRL_READS_FAIL,
     parse_reads_fail, NULL},
    {"outcome", "X-Mock-Outcome", CTRL_OUTCOME, parse_outcome, NULL},
    {"error", "X-Mock-Error", CTRL_ERROR, parse_error_text, NULL},
    {"outputs", "X-Mock-Outputs", CTRL_OUTPUTS, parse_outputs, NULL},
    {"filtered", "X-Mock-Filtered", CTRL_FILTERED, parse_filtered, NULL},
    {"webhook", "X-Mock-Webhook", CTRL_WEBHOOK, parse_webhook_text, parse_webhook_json},
    {"id_numeric", "X-Mock-Id-Numeric", CTRL_ID_NUMERIC, parse_id_numeric, NULL},
    {"id_missing", "X-Mock-Id-Missing", CTRL_ID_MISSING, parse_id_missing, NULL},
};

#define FIELD_COUNT (sizeof(field_table) / sizeof(field_table[0]))

/* Returns the field whose "_mock" key is name, or NULL when there is none. */
static const struct control_field *field_by_json_name(const char *name)
{
    for (size_t i = 0; i < FIELD_COUNT; i++)
        if (strcmp(field_table[i].json_name, name) == 0)
            return &field_table[i];
    return NULL;
}

/*
 * Turns a JSON control value into the text the parsers take, so that {"status": 503} and
 * {"status": "503"} mean the same.  Integers are printed into buf (at least 32 bytes).
 * Booleans become "true" and "false".  Returns NULL for values that are neither strings,
 * integers nor booleans.
 */
static const char *json_value_text(const cJSON *v, char *buf, size_t size)
{
    if (cJSON_IsString(v))
        return v->valuestring;
    if (cJSON_IsBool(v))
        return cJSON_IsTrue(v) ? "true" : "false";
    if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 1e9 &&
        v->valuedouble == (double)(long)v->valuedouble) {
        snprintf(buf, size, "%ld", (long)v->valuedouble);
        return buf;
    }
    return NULL;
}

/*
 * Parses a "_mock"-style JSON object into *out.  Returns false and describes the problem
 * in err (FAULTS_ERR_MAX bytes) when a key is unknown or a value is out of range.
 */
bool faults_parse_object(const cJSON *obj, struct mock_controls *out, char *err)
{
    const cJSON *item;

    memset(out, 0, sizeof(*out));
    if (!cJSON_IsObject(obj)) {
        snprintf(err, FAULTS_ERR_MAX, "mock controls must be a JSON object");
        return false;
    }
    cJSON_ArrayForEach(item, obj)
    {
        const struct control_field *f = field_by_json_name(item->string);
        char num[32];
        const char *text;

        /* Unknown keys are refused so that a misspelt control fails loudly in a test. */
        if (f == NULL) {
            snprintf(err, FAULTS_ERR_MAX, "unknown mock control \"%.60s\"", item->string);
            return false;
        }
        if (f->parse_json) {
            if (!f->parse_json(item, out, err))
                return false;
            out->set |= f->bit;
            continue;
        }
        text = json_value_text(item, num, sizeof(num));
        if (text == NULL) {
            snprintf(err, FAULTS_ERR_MAX,
                     "%s must be a string, a non-negative integer or a boolean", f->json_name);
            return false;
        }
        if (!f->parse(text, out, err))
            return false;
        out->set |= f->bit;
    }
    return true;
}

/*
 * Parses the X-Mock-* headers of the request into *out.  Returns false and describes the
 * problem in err (FAULTS_ERR_MAX bytes) when a value is invalid.
 */
bool faults_parse_headers(struct MHD_Connection *conn, struct mock_controls *out, char *err)
{
    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < FIELD_COUNT; i++) {
        const struct control_field *f = &field_table[i];
        const char *text = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, f->header_name);

        if (text == NULL)
            continue;
        if (!f->parse(text, out, err))
            return false;
        out->set |= f->bit;
    }
    return true;
}

/* Copies into dst every field that src sets and dst does not. */
void faults_merge(struct mock_controls *dst, const struct mock_controls *src)
{
    unsigned int take = src->set & ~dst->set;

    if (take & CTRL_DELAY)
        dst->delay_ms = src->delay_ms;
    if (take & CTRL_STATUS)
        dst->status = src->status;
    if (take & CTRL_FAULT)
        dst->fault = src->fault;
    if (take & CTRL_N_OUT)
        dst->n_out = src->n_out;
    if (take & CTRL_RETRY_AFTER)
        memcpy(dst->retry_after, src->retry_after, sizeof(dst->retry_after));
    if (take & CTRL_POLLS)
        dst->polls = src->polls;
    if (take & CTRL_POLL_DELAY)
        dst->poll_delay_ms = src->poll_delay_ms;
    if (take & CTRL_CANCEL_FAILS)
        dst->cancel_fails = src->cancel_fails;
    if (take & CTRL_READS_FAIL)
        dst->reads_fail_after_cancel = src->reads_fail_after_cancel;
    if (take & CTRL_OUTCOME)
        dst->fail = src->fail;
    if (take & CTRL_ERROR)
        memcpy(dst->error, src->error, sizeof(dst->error));
    if (take & CTRL_OUTPUTS)
        dst->outputs = src->outputs;
    if (take & CTRL_FILTERED)
        dst->filtered = src->filtered;
    if (take & CTRL_WEBHOOK)
        dst->webhook = src->webhook;
    if (take & CTRL_TASK_MADE)
        dst->task_made = src->task_made;
    if (take & CTRL_VISIBLE_AFTER)
        dst->visible_after_ms = src->visible_after_ms;
    if (take & CTRL_PAD)
        dst->pad_bytes = src->pad_bytes;
    if (take & CTRL_ID_NUMERIC)
        dst->id_numeric = src->id_numeric;
    if (take & CTRL_ID_MISSING)
        dst->id_missing = src->id_missing;
    dst->set |= take;
}

/* ---- Script queue ------------------------------------------------------------------ */

/* One queued script entry. */
struct script_node {
    struct mock_controls controls;
    struct script_node *next;
};

static pthread_mutex_t script_lock = PTHREAD_MUTEX_INITIALIZER;
static struct script_node *script_head;
static struct script_node *script_tail;
static size_t script_len;

/* Frees a detached list of script nodes. */
static void free_nodes(struct script_node *n)
{
    while (n) {
        struct script_node *next = n->next;

        free(n);
        n = next;
    }
}

/*
 * Appends the entries of a {"faults": [...]} document to the script queue, all or none.
 * Stores the number appended in *queued and the queue length afterwards in *pending.
 * Returns false and describes the problem in err (FAULTS_ERR_MAX bytes) on a bad document.
 */
bool faults_script_append(const cJSON *doc, size_t *queued, size_t *pending, char *err)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(doc, "faults");
    const cJSON *item;
    struct script_node *head = NULL, *tail = NULL;
    size_t n = 0;

    if (!cJSON_IsArray(list)) {
        snprintf(err, FAULTS_ERR_MAX, "body must be {\"faults\": [...]}");
        return false;
    }
    /* Everything is parsed before the queue is touched, so a bad entry queues nothing. */
    cJSON_ArrayForEach(item, list)
    {
        struct script_node *node = calloc(1, sizeof(*node));
        char entry_err[FAULTS_ERR_MAX];

        if (node == NULL) {
            snprintf(err, FAULTS_ERR_MAX, "out of memory");
            free_nodes(head);
            return false;
        }
        if (!faults_parse_object(item, &node->controls, entry_err)) {
            snprintf(err, FAULTS_ERR_MAX, "faults[%zu]: %.120s", n, entry_err);
            free(node);
            free_nodes(head);
            return false;
        }
        if (tail)
            tail->next = node;
        else
            head = node;
        tail = node;
        n++;
    }

    pthread_mutex_lock(&script_lock);
    if (script_len + n > SCRIPT_MAX) {
        pthread_mutex_unlock(&script_lock);
        snprintf(err, FAULTS_ERR_MAX, "script queue would exceed %u entries", SCRIPT_MAX);
        free_nodes(head);
        return false;
    }
    if (head) {
        if (script_tail)
            script_tail->next = head;
        else
            script_head = head;
        script_tail = tail;
    }
    script_len += n;
    *pending = script_len;
    pthread_mutex_unlock(&script_lock);

    *queued = n;
    return true;
}

/*
 * Removes the oldest script entry into *out.  Returns false, leaving *out alone, when the
 * queue is empty.
 */
bool faults_script_pop(struct mock_controls *out)
{
    struct script_node *node;

    pthread_mutex_lock(&script_lock);
    node = script_head;
    if (node) {
        script_head = node->next;
        if (script_head == NULL)
            script_tail = NULL;
        script_len--;
    }
    pthread_mutex_unlock(&script_lock);

    if (node == NULL)
        return false;
    *out = node->controls;
    free(node);
    return true;
}

/* Empties the script queue. */
void faults_script_reset(void)
{
    struct script_node *old;

    pthread_mutex_lock(&script_lock);
    old = script_head;
    script_head = script_tail = NULL;
    script_len = 0;
    pthread_mutex_unlock(&script_lock);
    free_nodes(old);
}
