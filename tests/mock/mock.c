/*
 * idemgate-mock: a counting mock of the generative-AI providers idemgate fronts.
 *
 * This file holds the process: command line, libmicrohttpd daemon, request body
 * accumulation, routing and the small administrative routes the tests drive.  Provider
 * routes are handled by providers.c, their ledger by ledger.c, faults by faults.c, the
 * task lookup and list by tasks.c, asynchronous tasks by async.c (shapes in shapes.c),
 * webhooks by webhooks.c (signatures in sign.c) and the listening socket by listener.c.
 *
 *   idemgate-mock --listen HOST:PORT [--delay-ms N] [--threads N] [--public-url URL]
 *   idemgate-mock --self-test
 */
#include "mock.h"

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "async.h"
#include "chaos.h"
#include "faults.h"
#include "idemkeys.h"
#include "ledger.h"
#include "listener.h"
#include "providers.h"
#include "reply.h"
#include "route.h"
#include "sign.h"
#include "stream.h"
#include "tasks.h"
#include "webhooks.h"

/* Largest request body accepted; bigger ones are drained and answered with 413. */
#define BODY_MAX (8u * 1024u * 1024u)


/* Default for --threads: connections served at once, each by its own thread. */
#define DEFAULT_CONNECTIONS 1000u

/* Stack of each connection thread; ample for cJSON's bounded recursion. */
#define THREAD_STACK_BYTES (512u * 1024u)

static atomic_bool shutting_down;
/* Readable once the mock stops: sleeping handlers wait on it (no periodic wake-ups, so thousands
 * of slow answers in flight cost no CPU). */
static int shutdown_fd = -1;

/* Marks the mock as stopping and wakes every sleeping handler. */
static void begin_shutdown(void)
{
    atomic_store(&shutting_down, true);
    if (shutdown_fd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(shutdown_fd, &one, sizeof(one));
        (void)w;
    }
}
static unsigned int default_delay_ms;
static char base_url[320];

/* Returns true once SIGTERM or SIGINT has asked the process to stop. */
bool mock_shutting_down(void)
{
    return atomic_load(&shutting_down);
}

/*
 * Returns the base URL ("http://HOST:PORT", no trailing slash) that clients use to reach
 * this mock, for the file links inside create responses.
 */
const char *mock_base_url(void)
{
    return base_url;
}

/* Returns the default create delay given by --delay-ms, in milliseconds. */
unsigned int mock_default_delay_ms(void)
{
    return default_delay_ms;
}

/* Returns a monotonic clock reading in milliseconds. */
static long long now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * Sleeps for up to ms milliseconds in short steps so that a shutdown ends the sleep early.
 * When stop_on_disconnect is true, the sleep also ends as soon as the client has closed
 * its side of the connection.  Returns true when the full time elapsed, false when the
 * sleep was cut short.
 */
bool mock_sleep_ms(const struct mock_request *req, unsigned int ms, bool stop_on_disconnect)
{
    const long long deadline = now_ms() + ms;
    struct pollfd pfd[2] = {{.fd = -1, .events = POLLRDHUP}, {.fd = shutdown_fd, .events = POLLIN}};

    if (stop_on_disconnect) {
        const union MHD_ConnectionInfo *info =
            MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_CONNECTION_FD);

        if (info)
            pfd[0].fd = info->connect_fd;
    }
    for (;;) {
        long long left = deadline - now_ms();

        if (left <= 0)
            return true;
        if (mock_shutting_down())
            return false;
        /* poll() doubles as the sleep; a negative fd is ignored, so it then only waits. */
        if (poll(pfd, 2, (int)(left < 3600000 ? left : 3600000)) > 0 &&
            (pfd[0].revents & (POLLRDHUP | POLLHUP | POLLERR)))
            return false;
    }
}

/* A connection closed: the listener may hand over another (listener.h). */
static void on_connection(void *cls, struct MHD_Connection *connection, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    (void)cls;
    (void)connection;
    (void)socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED)
        listener_connection_closed();
}

/* ---- Administrative and file routes ------------------------------------------------- */

/* GET /_health: reports that the mock is up. */
static enum MHD_Result handle_health(struct mock_request *req)
{
    cJSON *doc = cJSON_CreateObject();

    cJSON_AddBoolToObject(doc, "ok", 1);
    return reply_json(req, MHD_HTTP_OK, doc);
}

/* GET /_ledger: returns every create received since the start or the last reset. */
static enum MHD_Result handle_ledger(struct mock_request *req)
{
    char *text = ledger_to_json();
    struct MHD_Response *resp;

    if (text == NULL)
        return reply_error(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory", "mock_error",
                           "oom");
    /* The ledger can be large, so the buffer is handed over instead of copied. */
    resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    return reply_queue(req, MHD_HTTP_OK, resp);
}

/*
 * POST /_reset: forgets the ledger with its tasks, the asynchronous tasks, the seeded tasks,
 * the queued webhooks and their records, the fault script and every idempotency key,
 * restores the /_config settings and turns random mode off.
 */
static void mock_files_reset(void);

static enum MHD_Result handle_reset(struct mock_request *req)
{
    cJSON *doc = cJSON_CreateObject();

    ledger_reset();
    async_reset();
    webhooks_reset();
    faults_script_reset();
    idemkeys_reset();
    tasks_reset();
    chaos_reset();
    mock_files_reset();
    stream_reset();
    cJSON_AddBoolToObject(doc, "ok", 1);
    return reply_json(req, MHD_HTTP_OK, doc);
}

/* POST /_script: queues {"faults": [...]} entries, one per future create. */
static enum MHD_Result handle_script(struct mock_request *req)
{
    cJSON *doc = cJSON_ParseWithLength(req->body, req->body_len);
    char err[FAULTS_ERR_MAX];
    size_t queued = 0, pending = 0;
    bool ok = faults_script_append(doc, &queued, &pending, err);

    cJSON_Delete(doc);
    if (!ok)
        return reply_error(req, MHD_HTTP_BAD_REQUEST, err, "mock_error", "invalid_script");
    doc = cJSON_CreateObject();
    cJSON_AddNumberToObject(doc, "queued", (double)queued);
    cJSON_AddNumberToObject(doc, "pending", (double)pending);
    return reply_json(req, MHD_HTTP_OK, doc);
}

/* GET /_config: the task endpoint settings. */
static enum MHD_Result handle_config_get(struct mock_request *req)
{
    cJSON *doc = tasks_config_to_json();

    if (doc == NULL)
        return reply_error(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory", "mock_error",
                           "oom");
    return reply_json(req, MHD_HTTP_OK, doc);
}

/* POST /_config: changes some task endpoint settings, all or none, and answers all of them. */
static enum MHD_Result handle_config_post(struct mock_request *req)
{
    cJSON *doc = cJSON_ParseWithLength(req->body, req->body_len);
    char err[TASKS_ERR_MAX];
    bool ok = tasks_config_apply(doc, err);

    cJSON_Delete(doc);
    if (!ok)
        return reply_error(req, MHD_HTTP_BAD_REQUEST, err, "mock_error", "invalid_config");
    return handle_config_get(req);
}

/*
 * POST /_refuse: {"ms": N} closes the listening socket for N ms.  The answer is sent once
 * the socket is closed, so when a client has it, new connections are refused already.
 */
static enum MHD_Result handle_refuse(struct mock_request *req)
{
    cJSON *doc = cJSON_ParseWithLength(req->body, req->body_len);
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(doc, "ms");
    double value = cJSON_IsNumber(ms) ? ms->valuedouble : -1;
    char message[64];

    cJSON_Delete(doc);
    if (value < 1 || value > LISTENER_REFUSE_MAX_MS || value != (double)(unsigned int)value) {
        snprintf(message, sizeof(message), "ms must be an integer 1..%u", LISTENER_REFUSE_MAX_MS);
        return reply_error(req, MHD_HTTP_BAD_REQUEST, message, "mock_error", "invalid_refuse");
    }
    if (!listener_refuse((unsigned int)value))
        return reply_error(req, MHD_HTTP_SERVICE_UNAVAILABLE, "the mock is shutting down",
                           "mock_error", "shutting_down");
    doc = cJSON_CreateObject();
    cJSON_AddBoolToObject(doc, "ok", 1);
    cJSON_AddNumberToObject(doc, "refusing_ms", value);
    return reply_json(req, MHD_HTTP_OK, doc);
}

/*
 * How GET /files/ answers (POST /_files; /_reset restores it): every file padded with 'x' to
 * `bytes` (0: not padded), after `delay_ms` (a slow CDN), and a `fault`: "truncate" (the full Content-Length, half the body,
 * then the connection closes), "redirect" (302 to the same path on host "localhost", another
 * host name for the same server) or "status_404".
 */
static pthread_mutex_t files_mu = PTHREAD_MUTEX_INITIALIZER;
static long files_bytes;
static unsigned int files_delay_ms;
static char files_fault[16];
/* Files being answered now (a request counts from its arrival until its delay is over: the
 * answer follows at once) and the most at once since the last POST /_files or /_reset: GET
 * /_files says them. */
static unsigned int files_now, files_most;

static enum MHD_Result handle_files_post(struct mock_request *req)
{
    cJSON *doc = cJSON_ParseWithLength(req->body ? req->body : "", req->body_len);
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(doc, "bytes");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(doc, "fault");
    const cJSON *dl = cJSON_GetObjectItemCaseSensitive(doc, "delay_ms");
    if (!cJSON_IsObject(doc) || (b && (!cJSON_IsNumber(b) || b->valuedouble < 0 ||
                                       b->valuedouble > 256.0 * 1024 * 1024)) ||
        (dl && (!cJSON_IsNumber(dl) || dl->valuedouble < 0 || dl->valuedouble > 600000)) ||
        (f && !cJSON_IsNull(f) &&
         !(cJSON_IsString(f) && (!strcmp(f->valuestring, "truncate") ||
                                 !strcmp(f->valuestring, "redirect") ||
                                 !strcmp(f->valuestring, "status_404"))))) {
        cJSON_Delete(doc);
        return reply_error(req, MHD_HTTP_BAD_REQUEST,
                           "bytes: 0..268435456; delay_ms: 0..600000; fault: truncate, "
                           "redirect, status_404 or null",
                           "invalid_request_error", "invalid_files");
    }
    pthread_mutex_lock(&files_mu);
    files_bytes = b ? (long)b->valuedouble : 0;
    files_delay_ms = dl ? (unsigned int)dl->valuedouble : 0;
    snprintf(files_fault, sizeof(files_fault), "%s", cJSON_IsString(f) ? f->valuestring : "");
    files_most = files_now;
    pthread_mutex_unlock(&files_mu);
    cJSON_Delete(doc);
    cJSON *ok = cJSON_CreateObject();
    cJSON_AddBoolToObject(ok, "ok", 1);
    return reply_json(req, MHD_HTTP_OK, ok);
}

static void mock_files_reset(void)
{
    pthread_mutex_lock(&files_mu);
    files_bytes = 0;
    files_delay_ms = 0;
    files_fault[0] = '\0';
    files_most = files_now;
    pthread_mutex_unlock(&files_mu);
}

/* GET /_files: {"now": files being answered, "most": the most at once since they were set}. */
static enum MHD_Result handle_files_get(struct mock_request *req)
{
    cJSON *doc = cJSON_CreateObject();
    pthread_mutex_lock(&files_mu);
    cJSON_AddNumberToObject(doc, "now", files_now);
    cJSON_AddNumberToObject(doc, "most", files_most);
    pthread_mutex_unlock(&files_mu);
    return reply_json(req, MHD_HTTP_OK, doc);
}

struct half_body {
    char *body;
    size_t len;
};

/* Serves the first half of the body, then ends the connection short of its Content-Length. */
static ssize_t half_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct half_body *h = cls;
    size_t half = h->len / 2;
    if (pos >= half)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    size_t n = half - (size_t)pos < max ? half - (size_t)pos : max;
    memcpy(buf, h->body + pos, n);
    return (ssize_t)n;
}

static void half_free(void *cls)
{
    struct half_body *h = cls;
    free(h->body);
    free(h);
}

/*
 * GET /files/<name>: returns "PNG:<name>" as image/png, deterministic bytes standing in for
 * an image, or "MP4:<name>" as video/mp4 when the name ends in ".mp4" (then padded and faulted
 * as /_files says).
 */
static enum MHD_Result handle_file(struct mock_request *req)
{
    const char *name = req->url + strlen("/files/");
    size_t name_len = strlen(name);
    bool video = name_len > 4 && strcmp(name + name_len - 4, ".mp4") == 0;
    struct mock_reply r;
    enum MHD_Result ret;

    if (*name == '\0')
        return reply_error(req, MHD_HTTP_NOT_FOUND, "no such file", "invalid_request_error",
                           "not_found");
    long pad;
    unsigned int delay_ms;
    char fault[16];
    pthread_mutex_lock(&files_mu);
    pad = files_bytes;
    delay_ms = files_delay_ms;
    snprintf(fault, sizeof(fault), "%s", files_fault);
    if (++files_now > files_most)
        files_most = files_now;
    pthread_mutex_unlock(&files_mu);
    bool slept = !delay_ms || mock_sleep_ms(req, delay_ms, true);
    pthread_mutex_lock(&files_mu);
    files_now--;
    pthread_mutex_unlock(&files_mu);
    if (!slept)
        return MHD_NO; /* the client left, or the mock stops */
    if (!strcmp(fault, "status_404"))
        return reply_error(req, MHD_HTTP_NOT_FOUND, "no such file", "invalid_request_error",
                           "not_found");
    const char *host = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Host");
    if (!strcmp(fault, "redirect") && !(host && !strncasecmp(host, "localhost:", 10))) {
        char loc[1024];
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        snprintf(loc, sizeof(loc), "http://localhost:%s%s",
                 strrchr(mock_base_url(), ':') + 1, req->url);
        MHD_add_response_header(resp, "Location", loc);
        req->log_status = MHD_HTTP_FOUND;
        ret = MHD_queue_response(req->conn, MHD_HTTP_FOUND, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    reply_init(&r);
    r.status = MHD_HTTP_OK;
    r.content_type = video ? "video/mp4" : "image/png";
    r.body_len = strlen("PNG:") + name_len;
    if (pad > (long)r.body_len)
        r.body_len = (size_t)pad;
    r.body = malloc(r.body_len + 1);
    if (r.body == NULL)
        return MHD_NO;
    memset(r.body, 'x', r.body_len);
    int head = snprintf(r.body, r.body_len + 1, "%s:%s", video ? "MP4" : "PNG", name);
    if ((size_t)head < r.body_len)
        r.body[head] = 'x';
    if (!strcmp(fault, "truncate")) {
        struct half_body *h = malloc(sizeof(*h));
        struct MHD_Response *resp;
        if (!h) {
            reply_free(&r);
            return MHD_NO;
        }
        h->body = r.body;
        h->len = r.body_len;
        resp = MHD_create_response_from_callback(r.body_len, 4096, half_reader, h, half_free);
        MHD_add_response_header(resp, "Content-Type", r.content_type);
        req->log_status = MHD_HTTP_OK;
        req->log_fault = "truncate";
        ret = MHD_queue_response(req->conn, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    ret = reply_send(req, &r);
    reply_free(&r);
    return ret;
}

/* One route outside the provider personalities. */
struct admin_route {
    const char *method;
    const char *path;
    bool prefix; /* true when path is a prefix rather than the whole path */
    enum MHD_Result (*handle)(struct mock_request *req);
};

static const struct admin_route admin_routes[] = {
    {"GET", "/_health", false, handle_health},          /* readiness probe */
    {"GET", "/_ledger", false, handle_ledger},          /* the evidence the checker counts */
    {"POST", "/_reset", false, handle_reset},           /* a clean slate between tests */
    {"POST", "/_script", false, handle_script},         /* faults for the next creates */
    {"GET", "/_config", false, handle_config_get},      /* task endpoint settings */
    {"POST", "/_config", false, handle_config_post},    /* a provider without lookup or list */
    {"POST", "/_refuse", false, handle_refuse},         /* connection refused for a while */
    {"GET", "/_chaos", false, chaos_handle_get},        /* random mode and its draws */
    {"POST", "/_chaos", false, chaos_handle_post},      /* random mode on or off */
    {"GET", "/files/", true, handle_file},              /* outputs the create answers link to */
    {"POST", "/_files", false, handle_files_post},      /* size and faults of /files/ */
    {"GET", "/_files", false, handle_files_get},        /* files answered at once */
    {"GET", "/_tasks", true, async_handle_tasks},       /* asynchronous tasks with their counters */
    {"POST", "/_tasks/seed", false, tasks_handle_seed}, /* unrelated tasks on the account */
    {"GET", "/_webhooks", false, webhooks_handle_log},  /* webhook deliveries made */
    {"POST", "/_webhooks/send", false, async_handle_send},  /* a webhook delivered on demand */
    {"GET", "/_webhook_keys", false, webhooks_handle_keys}, /* fal's Ed25519 public key */
    {"POST", "/v1/chat/completions", false, stream_handle_chat}, /* LLM text, maybe streamed */
    {"POST", "/v1/messages", false, stream_handle_messages},     /* Anthropic's, the same */
    {"POST", "/v1/responses", false, stream_handle_responses},   /* OpenAI Responses, the same */
    {"GET", "/v1/responses/", true, stream_handle_response_get}, /* a stored response read back */
    {"POST", "/v1/responses/", true, stream_handle_response_get}, /* …/cancel: cancelled */
};

/*
 * Sends a request to its route, or answers 404 no_such_endpoint when there is none, the
 * same answer as a task endpoint switched off with /_config.
 */
static enum MHD_Result route(struct mock_request *req)
{
    enum MHD_Result ret;
    char message[96];

    if (providers_route(req, &ret))
        return ret;
    for (size_t i = 0; i < sizeof(admin_routes) / sizeof(admin_routes[0]); i++) {
        const struct admin_route *r = &admin_routes[i];
        bool match = r->prefix ? strncmp(req->url, r->path, strlen(r->path)) == 0
                               : strcmp(req->url, r->path) == 0;

        if (match && strcmp(req->method, r->method) == 0)
            return r->handle(req);
    }
    snprintf(message, sizeof(message), "no route for %.10s %.60s", req->method, req->url);
    return reply_error(req, MHD_HTTP_NOT_FOUND, message, "invalid_request_error",
                       "no_such_endpoint");
}

/* ---- libmicrohttpd glue ------------------------------------------------------------- */

/* The body of one request, gathered across the access handler's upload calls. */
struct body_buffer {
    char *data;
    size_t len;
    size_t cap;
    bool too_large;
};

/*
 * Appends an upload chunk to b, or marks b too large once the total passes BODY_MAX (the
 * rest is then drained and dropped).  Returns false when memory ran out.
 */
static bool body_append(struct body_buffer *b, const char *data, size_t len)
{
    if (b->too_large || len > BODY_MAX - b->len) {
        b->too_large = true;
        return true;
    }
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        char *grown;

        while (cap < b->len + len + 1)
            cap *= 2;
        grown = realloc(b->data, cap);
        if (grown == NULL)
            return false;
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
    return true;
}

/* Writes the one stderr line per request: method, path and what the client got. */
static void log_request(const struct mock_request *req)
{
    char outcome[64];

    if (req->log_status && req->log_fault)
        snprintf(outcome, sizeof(outcome), "%u fault=%s", req->log_status, req->log_fault);
    else if (req->log_fault)
        snprintf(outcome, sizeof(outcome), "fault=%s", req->log_fault);
    else if (req->log_status)
        snprintf(outcome, sizeof(outcome), "%u", req->log_status);
    else
        snprintf(outcome, sizeof(outcome), "closed");
    fprintf(stderr, "idemgate-mock: %.10s %.200s -> %s\n", req->method, req->url, outcome);
}

/*
 * libmicrohttpd access handler.  The first call of a request only allocates its body
 * buffer, the following calls collect upload chunks, and the final call (no more data)
 * routes the complete request, so every handler sees the whole body.
 */
static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls)
{
    struct body_buffer *b = *con_cls;
    struct mock_request req = {0};
    enum MHD_Result ret;

    (void)cls;
    (void)version;
    if (b == NULL) {
        b = calloc(1, sizeof(*b));
        if (b == NULL)
            return MHD_NO;
        *con_cls = b;
        return MHD_YES;
    }
    if (*upload_data_size != 0) {
        if (!body_append(b, upload_data, *upload_data_size))
            return MHD_NO;
        *upload_data_size = 0;
        return MHD_YES;
    }

    req.conn = conn;
    req.method = method;
    req.url = url;
    req.body = b->data ? b->data : "";
    req.body_len = b->len;
    if (b->too_large)
        ret = reply_error(&req, MHD_HTTP_CONTENT_TOO_LARGE, "request body too large",
                          "invalid_request_error", "body_too_large");
    else
        ret = route(&req);
    log_request(&req);
    return ret;
}

/* libmicrohttpd completion callback: frees the body buffer of a finished request. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct body_buffer *b = *con_cls;

    (void)cls;
    (void)conn;
    (void)toe;
    if (b) {
        free(b->data);
        free(b);
        *con_cls = NULL;
    }
}

/*
 * libmicrohttpd error logger: prefixes its messages so they can be told apart from the
 * mock's own lines in a test's captured stderr.
 */
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char line[512];

    (void)cls;
    vsnprintf(line, sizeof(line), fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    fprintf(stderr, "idemgate-mock: libmicrohttpd: %s\n", line);
}

/* ---- Command line and process lifecycle --------------------------------------------- */

/* Settings taken from the command line. */
struct options {
    char host[256];
    char port[8];
    unsigned int delay_ms;
    unsigned int connections;
    char public_url[256]; /* the base of the URLs the mock hands out; empty: its listen address */
    bool self_test;
};

/* Prints the usage text to f. */
static void usage(FILE *f)
{
    fprintf(f, "usage: idemgate-mock [--listen HOST:PORT] [--delay-ms N] [--threads N]\n"
               "                     [--public-url http://HOST:PORT]\n"
               "       idemgate-mock --self-test\n"
               "  --listen HOST:PORT  address to listen on (default 127.0.0.1:9090)\n"
               "  --delay-ms N        delay before answering every create (default 0)\n"
               "  --threads N         connections served at once, one thread each "
               "(default 1000)\n"
               "  --public-url URL    the base of the URLs it hands out (outputs, tasks), as its\n"
               "                      clients reach it (default: the listen address)\n"
               "  --self-test         check the webhook signatures and route patterns, print "
               "ok or the failures\n");
}

/* Parses a decimal number within [min, max] into *out; returns false on anything else. */
static bool parse_number(const char *text, unsigned long min, unsigned long max, unsigned int *out)
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

/*
 * Splits "HOST:PORT" (HOST may be a bracketed IPv6 literal) into opt->host and opt->port.
 * Returns false when the text is malformed.
 */
static bool parse_listen(const char *text, struct options *opt)
{
    const char *colon = strrchr(text, ':');
    const char *host = text;
    size_t host_len;
    unsigned int port;

    if (colon == NULL || !parse_number(colon + 1, 0, 65535, &port))
        return false;
    host_len = (size_t)(colon - text);
    if (host_len >= 2 && host[0] == '[' && host[host_len - 1] == ']') {
        host++;
        host_len -= 2;
    }
    if (host_len == 0 || host_len >= sizeof(opt->host))
        return false;
    memcpy(opt->host, host, host_len);
    opt->host[host_len] = '\0';
    snprintf(opt->port, sizeof(opt->port), "%u", port);
    return true;
}

/* Returned by parse_args() when the mock should start rather than exit. */
#define ARGS_START (-1)

/* Parses argv into *opt.  Returns ARGS_START to go on, or the exit status to leave with. */
static int parse_args(int argc, char **argv, struct options *opt)
{
    static const struct option longopts[] = {
        {"listen", required_argument, NULL, 'l'},  {"delay-ms", required_argument, NULL, 'd'},
        {"threads", required_argument, NULL, 't'}, {"self-test", no_argument, NULL, 's'},
        {"public-url", required_argument, NULL, 'u'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
    };
    int c;

    snprintf(opt->host, sizeof(opt->host), "127.0.0.1");
    snprintf(opt->port, sizeof(opt->port), "9090");
    opt->delay_ms = 0;
    opt->connections = DEFAULT_CONNECTIONS;
    opt->self_test = false;
    opt->public_url[0] = '\0';
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        const char *name = NULL;
        bool ok;

        if (c == 'l') {
            name = "listen";
            ok = parse_listen(optarg, opt);
        } else if (c == 'd') {
            name = "delay-ms";
            ok = parse_number(optarg, 0, 600000, &opt->delay_ms);
        } else if (c == 't') {
            name = "threads";
            ok = parse_number(optarg, 1, 100000, &opt->connections);
        } else if (c == 'u') {
            /* http://HOST:PORT with no path: the port is read back from it (a redirect). */
            const char *colon = strrchr(optarg, ':');
            name = "public-url";
            ok = strncmp(optarg, "http://", 7) == 0 && colon && colon > optarg + 7 &&
                 strlen(optarg) < sizeof(opt->public_url) && !strchr(optarg + 7, '/') &&
                 parse_number(colon + 1, 1, 65535, &(unsigned int){0});
            if (ok)
                snprintf(opt->public_url, sizeof(opt->public_url), "%s", optarg);
        } else if (c == 'h') {
            usage(stdout);
            return EXIT_SUCCESS;
        } else if (c == 's') {
            opt->self_test = true;
            ok = true;
        } else {
            ok = false;
        }
        if (!ok) {
            if (name)
                fprintf(stderr, "idemgate-mock: bad value for --%s: %s\n", name, optarg);
            usage(stderr);
            return EXIT_FAILURE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "idemgate-mock: unexpected argument: %s\n", argv[optind]);
        usage(stderr);
        return EXIT_FAILURE;
    }
    return ARGS_START;
}

/*
 * Raises the soft limit on open files to the hard limit, because every connection holds a
 * descriptor and the usual soft limit of 1024 is close to the default connection limit.
 */
static void raise_fd_limit(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/*
 * --self-test: checks the webhook signatures against published vectors, the route patterns
 * and random mode's PRNG, prints "ok" or one line per failure, and returns the exit status.
 */
static int self_test(void)
{
    int failures;

    if (!sign_init())
        return EXIT_FAILURE;
    failures = sign_self_test() + route_self_test() + chaos_self_test();
    sign_shutdown();
    if (failures == 0)
        printf("ok\n");
    else
        printf("%d check(s) failed\n", failures);
    return failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/*
 * Starts the mock, prints the "listening" line and serves until SIGTERM or SIGINT.
 * Returns 0 after a clean shutdown, 1 when the mock could not start.
 */
int main(int argc, char **argv)
{
    struct options opt;
    struct MHD_Daemon *daemon;
    unsigned int flags;
    unsigned int port;
    sigset_t stop_signals;
    int rc, sig;

    rc = parse_args(argc, argv, &opt);
    if (rc != ARGS_START)
        return rc;
    if (opt.self_test)
        return self_test();
    default_delay_ms = opt.delay_ms;
    tasks_config_reset();
    /* libcurl's global state and the webhook keys are set up while there is one thread. */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "idemgate-mock: cannot initialise libcurl\n");
        return EXIT_FAILURE;
    }
    if (!sign_init()) {
        curl_global_cleanup();
        return EXIT_FAILURE;
    }
    /*
     * The mock binds the socket itself, before any connection thread exists, so that the
     * port, and with it the base URL, is known before a thread can read it.
     */
    if (!listener_open(opt.host, opt.port, &port)) {
        sign_shutdown();
        curl_global_cleanup();
        return EXIT_FAILURE;
    }
    if (strchr(opt.host, ':'))
        snprintf(base_url, sizeof(base_url), "http://[%s]:%u", opt.host, port);
    else
        snprintf(base_url, sizeof(base_url), "http://%s:%u", opt.host, port);
    char listening[320];
    snprintf(listening, sizeof(listening), "%s", base_url + strlen("http://"));
    if (opt.public_url[0])
        snprintf(base_url, sizeof(base_url), "%s", opt.public_url);

    /*
     * A client that disconnects while the mock sleeps would otherwise kill the process
     * with SIGPIPE on the next write.  The stop signals are blocked before any thread
     * exists, so every thread inherits the mask and only sigwait() below receives them.
     */
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    raise_fd_limit();
    if (!webhooks_start()) {
        listener_close();
        sign_shutdown();
        curl_global_cleanup();
        return EXIT_FAILURE;
    }

    /*
     * One thread per connection lets a handler sleep (delays, hangs) without holding up
     * other clients; poll() instead of select() lifts the FD_SETSIZE ceiling.  The daemon
     * has no listening socket: listener.c accepts and hands it every connection, so that
     * /_refuse can close the socket while the daemon goes on serving.
     */
    flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
            MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    /* The logger comes first so that libmicrohttpd routes every message through it. */
    shutdown_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    listener_set_limit(opt.connections);
    daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_access, NULL, MHD_OPTION_EXTERNAL_LOGGER,
                              on_mhd_log, NULL, MHD_OPTION_CONNECTION_LIMIT,
                              LISTENER_MHD_LIMIT(opt.connections),
                              MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL,
                              MHD_OPTION_THREAD_STACK_SIZE, (size_t)THREAD_STACK_BYTES,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_END);
    if (daemon == NULL) {
        fprintf(stderr, "idemgate-mock: cannot start the HTTP daemon\n");
        begin_shutdown();
        webhooks_stop();
        listener_close();
        sign_shutdown();
        curl_global_cleanup();
        return EXIT_FAILURE;
    }
    /* IPv6 literals are bracketed so that the line always splits at its last colon. */
    printf("idemgate-mock listening on %s\n", listening);
    fflush(stdout);

    sig = listener_run(daemon, &stop_signals);
    fprintf(stderr, "idemgate-mock: signal %d, shutting down\n", sig);

    /* Sleeping handlers watch this, so stopping the daemon does not wait on them. */
    begin_shutdown();
    listener_close();
    MHD_stop_daemon(daemon);
    webhooks_stop();
    ledger_shutdown();
    async_reset();
    faults_script_reset();
    idemkeys_reset();
    sign_shutdown();
    curl_global_cleanup();
    return EXIT_SUCCESS;
}
