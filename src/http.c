#include "idemgate/http.h"

#include "idemgate/api.h"
#include "idemgate/crypto.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/store.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct http_server {
    struct MHD_Daemon *daemon;
    const struct cfg *cfg;
    struct waiters *waiters;
    pthread_mutex_t mu; /* guards dbs and the suspended list */
    struct db **dbs;
    size_t n_dbs;
    struct http_req *suspended; /* requests suspended and not yet resumed */
    atomic_long in_progress;    /* requests from their first call to their completion */
    atomic_int draining;        /* quiesced: every answer closes its connection */
    int listen_fd;              /* handed back by MHD_quiesce_daemon; closed by http_stop */
    char id_prefix[9];
};

struct http_req {
    struct http_server *srv;
    struct MHD_Connection *conn;
    const char *method;
    char *path;
    char *body;
    size_t body_len, body_cap;
    int too_large;
    int responded;
    struct http_wait wait;
    struct http_req *susp_prev, *susp_next; /* in srv->suspended (under srv->mu) */
    int in_suspended;                       /* suspended and not yet resumed (under srv->mu) */
    char request_id[72];
    int status;   /* of the queued response */
    int route;    /* enum metric_route */
    struct timespec started;
};

/* One database connection per server thread: the pool is sized to the threads. */
static __thread struct db *tls_db;
static atomic_ulong request_counter;

void http_req_set_route(struct http_req *r, int route)
{
    r->route = route;
}

const char *http_req_id(const struct http_req *r)
{
    return r->request_id;
}

const char *http_req_method(const struct http_req *r)
{
    return r->method;
}

const char *http_req_path(const struct http_req *r)
{
    return r->path;
}

const char *http_req_header(const struct http_req *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

const char *http_req_query(const struct http_req *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
}

struct count_ctx {
    const char *name;
    int n;
};

static enum MHD_Result count_cb(void *cls, enum MHD_ValueKind kind, const char *key,
                                const char *value)
{
    (void)kind;
    (void)value;
    struct count_ctx *c = cls;
    if (strcasecmp(key, c->name) == 0)
        c->n++;
    return MHD_YES;
}

int http_req_header_count(const struct http_req *r, const char *name)
{
    struct count_ctx c = {name, 0};
    MHD_get_connection_values(r->conn, MHD_HEADER_KIND, count_cb, &c);
    return c.n;
}

const char *http_req_body(const struct http_req *r, size_t *len)
{
    *len = r->body_len;
    return r->body ? r->body : "";
}

int http_req_body_too_large(const struct http_req *r)
{
    return r->too_large;
}

const struct cfg *http_req_cfg(const struct http_req *r)
{
    return r->srv->cfg;
}

struct waiters *http_req_waiters(const struct http_req *r)
{
    return r->srv->waiters;
}

struct http_wait *http_req_wait(struct http_req *r)
{
    return &r->wait;
}

struct db *http_req_db(const struct http_req *r)
{
    if (!tls_db) {
        tls_db = store_db_open(r->srv->cfg->database_url);
        if (!tls_db)
            return NULL;
        pthread_mutex_lock(&r->srv->mu);
        struct db **nv = realloc(r->srv->dbs, (r->srv->n_dbs + 1) * sizeof(*nv));
        if (nv) {
            nv[r->srv->n_dbs++] = tls_db;
            r->srv->dbs = nv;
        }
        pthread_mutex_unlock(&r->srv->mu);
    }
    return tls_db;
}

/* Takes r off the suspended list if it is there; the caller holds s->mu. */
static void suspended_remove_locked(struct http_server *s, struct http_req *r)
{
    if (!r->in_suspended)
        return;
    if (r->susp_prev)
        r->susp_prev->susp_next = r->susp_next;
    else
        s->suspended = r->susp_next;
    if (r->susp_next)
        r->susp_next->susp_prev = r->susp_prev;
    r->susp_prev = r->susp_next = NULL;
    r->in_suspended = 0;
}

/* Resumes every request suspended and not yet resumed (libmicrohttpd must not be stopped with a
 * suspended connection) and returns how many there were. A request on the list has a live
 * connection: libmicrohttpd neither times out nor closes a suspended one. libmicrohttpd never
 * calls us back while holding its own locks, so holding ours across MHD_resume_connection
 * cannot deadlock. */
static long resume_all(struct http_server *s)
{
    long n = 0;
    pthread_mutex_lock(&s->mu);
    while (s->suspended) {
        struct http_req *r = s->suspended;
        suspended_remove_locked(s, r);
        MHD_resume_connection(r->conn);
        n++;
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

void http_suspend(struct http_req *r)
{
    struct http_server *s = r->srv;
    r->wait.active = 1;
    pthread_mutex_lock(&s->mu);
    if (!r->in_suspended) {
        r->susp_prev = NULL;
        r->susp_next = s->suspended;
        if (s->suspended)
            s->suspended->susp_prev = r;
        s->suspended = r;
        r->in_suspended = 1;
    }
    pthread_mutex_unlock(&s->mu);
    MHD_suspend_connection(r->conn);
}

/* Exactly one resumption per suspension: whoever takes r off the list resumes it (a waiter,
 * the handler that could not register one, or resume_all at shutdown). */
void http_resume(void *arg)
{
    struct http_req *r = arg;
    struct http_server *s = r->srv;
    pthread_mutex_lock(&s->mu);
    int mine = r->in_suspended;
    suspended_remove_locked(s, r);
    pthread_mutex_unlock(&s->mu);
    if (mine)
        MHD_resume_connection(r->conn);
}

int http_respond(struct http_req *r, int status, const char *content_type, const char *body,
                 size_t len, const char *const *headers)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return -1;
    if (content_type)
        MHD_add_response_header(resp, "Content-Type", content_type);
    MHD_add_response_header(resp, "X-Request-Id", r->request_id);
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    int has_connection = 0;
    for (const char *const *h = headers; h && h[0]; h += 2) {
        MHD_add_response_header(resp, h[0], h[1]);
        has_connection |= strcasecmp(h[0], "Connection") == 0;
    }
    /* Shutting down: a kept-alive connection gets this answer and no further request. */
    if (atomic_load(&r->srv->draining) && !has_connection)
        MHD_add_response_header(resp, "Connection", "close");
    enum MHD_Result ok = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    r->responded = 1;
    r->status = status;
    return ok == MHD_YES ? 0 : -1;
}

static void json_escape_into(char *out, size_t cap, const char *s)
{
    size_t pos = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && pos + 7 < cap; p++) {
        if (*p == '"' || *p == '\\') {
            out[pos++] = '\\';
            out[pos++] = (char)*p;
        } else if (*p < 0x20) {
            pos += (size_t)snprintf(out + pos, cap - pos, "\\u%04x", *p);
        } else {
            out[pos++] = (char)*p;
        }
    }
    out[pos] = '\0';
}

int http_problem(struct http_req *r, int status, const char *type, const char *title,
                 const char *detail, int retry_after)
{
    char esc_title[256], esc_detail[512], body[1024], ra[16];
    json_escape_into(esc_title, sizeof(esc_title), title);
    json_escape_into(esc_detail, sizeof(esc_detail), detail ? detail : title);
    int n = snprintf(body, sizeof(body),
                     "{\"type\":\"urn:idemgate:problem:%s\",\"title\":\"%s\",\"status\":%d,"
                     "\"detail\":\"%s\",\"request_id\":\"%s\"}",
                     type, esc_title, status, esc_detail, r->request_id);
    const char *hdrs[7] = {NULL};
    int h = 0;
    if (retry_after > 0) {
        snprintf(ra, sizeof(ra), "%d", retry_after);
        hdrs[h++] = "Retry-After";
        hdrs[h++] = ra;
    }
    if (status == 401 && strcmp(type, "unauthorized") == 0) {
        hdrs[h++] = "WWW-Authenticate";
        hdrs[h++] = "Bearer realm=\"idemgate\"";
    }
    if (status == 405 && detail) {
        hdrs[h++] = "Allow";
        hdrs[h++] = detail; /* method_not_allowed passes the allowed method as the detail */
    }
    if (status == 400 && strcmp(type, "bad-request-framing") == 0) {
        hdrs[h++] = "Connection";
        hdrs[h++] = "close";
    }
    return http_respond(r, status, "application/problem+json", body,
                        (size_t)(n < (int)sizeof(body) ? n : (int)sizeof(body) - 1), hdrs);
}

/* Request smuggling defences libmicrohttpd 0.9.75 lacks: two Content-Lengths, Content-Length
 * with Transfer-Encoding, a header name holding whitespace ("Name : v"). */
struct framing {
    int content_length, transfer_encoding, bad_name;
};

static enum MHD_Result framing_cb(void *cls, enum MHD_ValueKind kind, const char *key,
                                  const char *value)
{
    (void)kind;
    (void)value;
    struct framing *f = cls;
    if (strcasecmp(key, "Content-Length") == 0)
        f->content_length++;
    else if (strcasecmp(key, "Transfer-Encoding") == 0)
        f->transfer_encoding++;
    if (strpbrk(key, " \t") || !*key)
        f->bad_name = 1;
    return MHD_YES;
}

static void set_request_id(struct http_server *s, struct http_req *r)
{
    const char *in = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "X-Request-Id");
    size_t n = in ? strlen(in) : 0;
    if (n > 0 && n <= 64 &&
        strspn(in, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") == n) {
        memcpy(r->request_id, in, n + 1);
        return;
    }
    snprintf(r->request_id, sizeof(r->request_id), "req_%s%08lx", s->id_prefix,
             atomic_fetch_add(&request_counter, 1));
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    struct http_server *s = cls;
    struct http_req *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof(*r));
        if (!r)
            return MHD_NO;
        atomic_fetch_add(&s->in_progress, 1);
        r->srv = s;
        r->conn = conn;
        r->route = MR_OTHER;
        clock_gettime(CLOCK_MONOTONIC, &r->started);
        r->method = method;
        r->path = strdup(url);
        *con_cls = r;
        if (!r->path)
            return MHD_NO;
        set_request_id(s, r);
        struct framing f = {0, 0, 0};
        MHD_get_connection_values(conn, MHD_HEADER_KIND, framing_cb, &f);
        if (f.content_length > 1 || (f.content_length && f.transfer_encoding) || f.bad_name)
            return http_problem(r, 400, "bad-request-framing", "Ambiguous request framing",
                                "conflicting Content-Length/Transfer-Encoding or a malformed "
                                "header name",
                                0) == 0
                       ? MHD_YES
                       : MHD_NO;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > (unsigned long long)s->cfg->max_body_bytes)
            r->too_large = 1;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (r->responded || r->too_large)
            return MHD_YES;
        if (r->body_len + n > (size_t)s->cfg->max_body_bytes) {
            /* A chunked body that grew past the cap: stop keeping it. */
            r->too_large = 1;
            free(r->body);
            r->body = NULL;
            r->body_len = 0;
            return MHD_YES;
        }
        if (r->body_len + n + 1 > r->body_cap) {
            size_t cap = r->body_cap ? r->body_cap : 4096;
            while (cap < r->body_len + n + 1)
                cap *= 2;
            char *nb = realloc(r->body, cap);
            if (!nb)
                return MHD_NO;
            r->body = nb;
            r->body_cap = cap;
        }
        memcpy(r->body + r->body_len, upload_data, n);
        r->body_len += n;
        r->body[r->body_len] = '\0';
        return MHD_YES;
    }
    if (r->responded)
        return MHD_YES;
    api_handle(r);
    /* A handler either responded or suspended the connection; anything else is a bug that
     * must not leave the client hanging. */
    if (!r->responded && !r->wait.active)
        http_problem(r, 500, "internal", "Internal error", "no response was produced", 0);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)conn;
    struct http_server *s = cls;
    struct http_req *r = *con_cls;
    if (!r)
        return;
    pthread_mutex_lock(&s->mu); /* never on the list here; a broken invariant costs no UAF */
    suspended_remove_locked(s, r);
    pthread_mutex_unlock(&s->mu);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double secs = (double)(now.tv_sec - r->started.tv_sec) +
                  (double)(now.tv_nsec - r->started.tv_nsec) / 1e9;
    metrics_http((enum metric_route)r->route, r->status, secs);
    /* One access line per request: ids and classes only, never a body, token or key. */
    LOG(r->status >= 500 ? LOG_WARN : LOG_INFO, "http", LS("request_id", r->request_id),
        LS("method", r->method), LS("route", metrics_route_name(r->route)),
        LI("status", r->status), LI("us", (long long)(secs * 1e6)),
        LI("completed", toe == MHD_REQUEST_TERMINATED_COMPLETED_OK));
    free(r->path);
    free(r->body);
    free(r);
    *con_cls = NULL;
    atomic_fetch_sub(&s->in_progress, 1);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[256];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    LOG(LOG_DEBUG, "mhd", LS("message", msg));
}

struct http_server *http_start(const struct cfg *cfg, struct waiters *w)
{
    struct http_server *s = calloc(1, sizeof(*s));
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)cfg->listen_port)};
    uint8_t rnd[4];
    if (!s)
        return NULL;
    s->cfg = cfg;
    s->waiters = w;
    s->listen_fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    if (crypto_random(rnd, sizeof(rnd)) < 0)
        memset(rnd, 0, sizeof(rnd));
    crypto_hex(rnd, sizeof(rnd), s->id_prefix);
    if (inet_pton(AF_INET, cfg->listen_host, &addr.sin_addr) != 1) {
        LOG(LOG_ERROR, "http_start_failed", LS("error", "listen host must be an IPv4 address"),
            LS("host", cfg->listen_host));
        goto failed;
    }
    s->daemon = MHD_start_daemon(
        MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
            MHD_USE_TURBO,
        (uint16_t)cfg->listen_port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&addr, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)cfg->http_threads,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
        s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL, MHD_OPTION_LISTENING_ADDRESS_REUSE,
        (unsigned)1, MHD_OPTION_END);
    if (!s->daemon) {
        LOG(LOG_ERROR, "http_start_failed", LS("error", "cannot listen"),
            LS("host", cfg->listen_host), LI("port", cfg->listen_port));
        goto failed;
    }
    return s;
failed:
    pthread_mutex_destroy(&s->mu);
    free(s);
    return NULL;
}

void http_quiesce(struct http_server *s)
{
    if (!s || !s->daemon || atomic_load(&s->draining))
        return;
    atomic_store(&s->draining, 1);
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    if (fd == MHD_INVALID_SOCKET) {
        LOG(LOG_WARN, "http_quiesce_failed", LS("note", "the listening socket stays open"));
        return;
    }
    /* libmicrohttpd's threads may still hold the descriptor, so it is closed only after
     * MHD_stop_daemon; shutting the listener down now makes the kernel refuse new connections
     * (ECONNREFUSED) and reset those not yet accepted, instead of leaving them queued. */
    s->listen_fd = fd;
    if (shutdown(fd, SHUT_RDWR) != 0)
        LOG(LOG_WARN, "http_quiesce_failed", LS("note", "shutdown of the listening socket"));
}

/* Waits up to timeout_ms for no request to be in progress; returns 1 when none is. */
static int wait_idle(struct http_server *s, int timeout_ms)
{
    for (int waited = 0; atomic_load(&s->in_progress) > 0; waited += 10) {
        if (waited >= timeout_ms)
            return 0;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 1;
}

void http_drain(struct http_server *s, int timeout_ms)
{
    if (!s || wait_idle(s, timeout_ms))
        return;
    /* A slow client can hold the drain this long. A request still suspended now would be a
     * bug (every suspension has a waiter, and waiters_close woke them all), but its client
     * must still get an answer: resume it and give it a moment. */
    long n = resume_all(s);
    LOG(LOG_WARN, "http_drain_timeout", LI("in_progress", atomic_load(&s->in_progress)),
        LI("resumed", n));
    if (n)
        (void)wait_idle(s, 1000);
}

void http_stop(struct http_server *s)
{
    if (!s)
        return;
    if (s->daemon) {
        /* Nothing may stay suspended when the daemon stops (libmicrohttpd aborts). */
        long n = resume_all(s);
        if (n)
            LOG(LOG_WARN, "http_resumed_at_stop", LI("requests", n));
        MHD_stop_daemon(s->daemon);
    }
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    /* The server threads are gone: their database connections can be closed. */
    for (size_t i = 0; i < s->n_dbs; i++)
        store_db_close(s->dbs[i]);
    free(s->dbs);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
