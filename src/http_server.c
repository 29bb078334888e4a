#include "idemgate/http_server.h"

#include "idemgate/bodyshare.h"
#include "idemgate/crypto.h"
#include "idemgate/log.h"
#include "idemgate/reqlimit.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct hs_server {
    struct MHD_Daemon *daemon;
    struct hs_options o;
    pthread_mutex_t mu;       /* guards the suspended list */
    struct hs_req *suspended; /* requests suspended and not yet resumed */
    atomic_long in_progress;  /* requests from their first call to their completion */
    atomic_int draining;      /* quiesced: every answer closes its connection */
    int listen_fd;            /* handed back by MHD_quiesce_daemon; closed by hs_stop */
    char id_prefix[9];
    long share; /* a tenant's bodies at most (max_buffered_bytes / HS_OWNER_SHARE, or a body) */
    long reserve; /* of max_buffered_bytes, kept for the first body of a tenant holding none */
    /* The connections, for the whole-request deadline and the health reserve (hs_conn). */
    pthread_mutex_t conn_mu;
    pthread_cond_t conn_cv;    /* wakes the deadline thread at hs_stop */
    struct hs_conn *conns;     /* under conn_mu */
    long n_conns;              /* under conn_mu */
    int sweeper_started, sweeper_stop;
    pthread_t sweeper;
};

/* One client connection, from libmicrohttpd's connection notifications (its socket context).
 * A request must arrive whole — headers and body — within request_deadline_s of `since`: the
 * connection's accept, or the end of its previous request. libmicrohttpd's own timeout counts
 * only idle time, so a client sending one byte every few seconds held a request for ever. */
struct hs_conn {
    struct hs_conn *prev, *next; /* in srv->conns (under conn_mu) */
    int fd;                      /* owned by libmicrohttpd; valid until the CLOSED notification */
    struct timespec since;       /* under conn_mu */
    int receiving;               /* a request is being received (or awaited): the deadline runs */
    int over_limit;              /* accepted beyond max_connections: the health reserve */
    int cut;                     /* the deadline thread shut its socket down */
};

struct hs_req {
    struct hs_server *srv;
    struct MHD_Connection *conn;
    int begun;                   /* begin_request ran: the request reached on_request */
    enum rl_uri_verdict refused; /* the target was refused before libmicrohttpd parsed it */
    int target_nul;              /* the request target held a raw NUL byte */
    const char *method;
    char *path; /* as sent: not percent-decoded, without the query */
    char *body;
    size_t body_len, body_cap;
    long body_max; /* max_body_bytes, or max_upload_bytes for a multipart/form-data body */
    long counted;  /* of body_bytes: this body's allocation */
    int untrusted; /* body_owner did not know its token: counted in untrusted_bytes too */
    long long owner; /* the tenant (> 0) whose body it is (counted in its bytes too), or 0 */
    int too_large;
    int over_memory; /* its body would have passed max_buffered_bytes: dropped */
    int over_share;  /* that is, its tenant's share of it */
    int over_reserve; /* that is, the bound less the reserve for tenants holding no body */
    int responded;
    int close_after;                      /* the answer closes the connection (health reserve) */
    int suspended_once;                   /* the handler suspended it at least once */
    struct hs_req *susp_prev, *susp_next; /* in srv->suspended (under srv->mu) */
    int in_suspended;                     /* suspended and not yet resumed (under srv->mu) */
    int held;                             /* another thread holds it (hs_suspend_held; mu) */
    struct MHD_Response *pending; /* answered from another thread: queued when resumed (mu) */
    int pending_status;
    char request_id[72];
    int status; /* of the queued response */
    struct timespec started;
    void *state;
    void (*state_free)(void *state);
    atomic_int gone; /* found with its client gone while suspended (hs_req_set_gone) */
    int http10;      /* an HTTP/1.0 request: no chunked body, its end is the connection's */
};

static atomic_ulong request_counter;

/* The request whose callback this server thread is in: hs_respond queues its answer at once;
 * an answer from anywhere else waits in hs_req.pending for the resumption. */
static __thread struct hs_req *tls_handling;

const char *hs_req_id(const struct hs_req *r)
{
    return r->request_id;
}

const char *hs_req_method(const struct hs_req *r)
{
    return r->method ? r->method : "";
}

const char *hs_req_path(const struct hs_req *r)
{
    return r->path;
}

const char *hs_req_header(const struct hs_req *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

const char *hs_req_header_n(const struct hs_req *r, const char *name, size_t *len)
{
    const char *v = NULL;
    size_t n = 0;
    if (MHD_lookup_connection_value_n(r->conn, MHD_HEADER_KIND, name, strlen(name), &v, &n) !=
            MHD_YES ||
        !v)
        return NULL;
    *len = n;
    return v;
}

const char *hs_req_query(const struct hs_req *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
}

struct query_check {
    const char *const *known;
    unsigned seen; /* bit i: known[i] was given */
    const char *bad;
    int repeated;
};

static enum MHD_Result query_check_cb(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    (void)kind;
    (void)value;
    struct query_check *q = cls;
    for (unsigned i = 0; q->known[i] && i < 32; i++) {
        if (strcmp(q->known[i], key) != 0)
            continue;
        if (q->seen & (1u << i)) {
            q->bad = key;
            q->repeated = 1;
            return MHD_NO;
        }
        q->seen |= 1u << i;
        return MHD_YES;
    }
    q->bad = key;
    return MHD_NO;
}

const char *hs_req_query_check(const struct hs_req *r, const char *const *known, int *repeated)
{
    struct query_check q = {.known = known};
    MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, query_check_cb, &q);
    *repeated = q.repeated;
    return q.bad;
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

int hs_req_header_count(const struct hs_req *r, const char *name)
{
    struct count_ctx c = {name, 0};
    MHD_get_connection_values(r->conn, MHD_HEADER_KIND, count_cb, &c);
    return c.n;
}

const char *hs_req_body(const struct hs_req *r, size_t *len)
{
    *len = r->body_len;
    return r->body ? r->body : "";
}

int hs_req_body_too_large(const struct hs_req *r)
{
    return r->too_large;
}

void *hs_req_state(const struct hs_req *r)
{
    return r->state;
}

void hs_req_set_state(struct hs_req *r, void *state, void (*free_fn)(void *state))
{
    if (r->state && r->state_free && r->state != state)
        r->state_free(r->state);
    r->state = state;
    r->state_free = free_fn;
}

/* Takes r off the suspended list if it is there; the caller holds s->mu. */
static void suspended_remove_locked(struct hs_server *s, struct hs_req *r)
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
 * suspended connection) and returns how many there were — but for one another thread holds
 * (hs_suspend_held) when held is 0: resumed, a connection whose client has gone is closed and
 * its request freed by libmicrohttpd at once, before any handler runs again, under the thread
 * still writing into it; that thread's hs_release resumes it. A request on the list has a live
 * connection: libmicrohttpd neither times out nor closes a suspended one. libmicrohttpd never
 * calls us back while holding its own locks, so holding ours across MHD_resume_connection
 * cannot deadlock. */
static long resume_all(struct hs_server *s, int held)
{
    long n = 0;
    pthread_mutex_lock(&s->mu);
    for (struct hs_req *r = s->suspended, *next; r; r = next) {
        next = r->susp_next;
        if (r->held && !held)
            continue;
        suspended_remove_locked(s, r);
        MHD_resume_connection(r->conn);
        n++;
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Lists r as suspended (under s->mu); 0 when it was already. */
static int suspended_add_locked(struct hs_server *s, struct hs_req *r)
{
    if (r->in_suspended) /* suspended already: once is enough */
        return 0;
    r->susp_prev = NULL;
    r->susp_next = s->suspended;
    if (s->suspended)
        s->suspended->susp_prev = r;
    s->suspended = r;
    r->in_suspended = 1;
    return 1;
}

static void suspend(struct hs_req *r, int held)
{
    struct hs_server *s = r->srv;
    r->suspended_once = 1;
    pthread_mutex_lock(&s->mu);
    if (held)
        r->held = 1;
    int added = suspended_add_locked(s, r);
    pthread_mutex_unlock(&s->mu);
    if (added)
        MHD_suspend_connection(r->conn);
}

void hs_suspend(struct hs_req *r)
{
    suspend(r, 0);
}

void hs_suspend_held(struct hs_req *r)
{
    suspend(r, 1);
}

/* Exactly one resumption per suspension: whoever takes r off the list resumes it (a waiter,
 * the handler that could not register one, or resume_all at shutdown). */
void hs_resume(void *arg)
{
    struct hs_req *r = arg;
    struct hs_server *s = r->srv;
    pthread_mutex_lock(&s->mu);
    int mine = r->in_suspended;
    suspended_remove_locked(s, r);
    pthread_mutex_unlock(&s->mu);
    if (mine)
        MHD_resume_connection(r->conn);
}

void hs_release(struct hs_req *r)
{
    struct hs_server *s = r->srv;
    pthread_mutex_lock(&s->mu);
    r->held = 0;
    int mine = r->in_suspended;
    suspended_remove_locked(s, r);
    pthread_mutex_unlock(&s->mu);
    if (mine)
        MHD_resume_connection(r->conn);
}

static struct hs_conn *conn_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Starts (1: a request is awaited from now on) or stops (0: the request is whole, or answered)
 * the deadline of conn's current request. */
static void conn_receiving(struct hs_server *s, struct MHD_Connection *conn, int receiving)
{
    struct hs_conn *c = conn_of(conn);
    if (!c)
        return;
    pthread_mutex_lock(&s->conn_mu);
    if (receiving && !c->receiving)
        clock_gettime(CLOCK_MONOTONIC, &c->since);
    c->receiving = receiving;
    pthread_mutex_unlock(&s->conn_mu);
}

/* MHD_OPTION_NOTIFY_CONNECTION. libmicrohttpd calls CLOSED before it closes the socket, and the
 * deadline thread touches a socket only under conn_mu while its record is listed, so it never
 * shuts down a descriptor that was closed and reused. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct hs_server *s = cls;
    struct hs_conn *c = *socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci || !(c = calloc(1, sizeof(*c))))
            return; /* untracked: libmicrohttpd's idle timeout still applies */
        c->fd = ci->connect_fd;
        c->receiving = 1;
        clock_gettime(CLOCK_MONOTONIC, &c->since);
        pthread_mutex_lock(&s->conn_mu);
        c->over_limit = ++s->n_conns > (long)s->o.max_connections;
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        pthread_mutex_unlock(&s->conn_mu);
        *socket_context = c;
        return;
    }
    if (!c)
        return;
    pthread_mutex_lock(&s->conn_mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->n_conns--;
    pthread_mutex_unlock(&s->conn_mu);
    free(c);
    *socket_context = NULL;
}

/* The deadline thread: twice a second, every connection whose request is not whole past its
 * deadline (HS_RESERVE_DEADLINE_S in the health reserve) has its socket shut down; libmicrohttpd
 * sees the end of the stream at once and closes the connection (no answer can be queued while
 * a request is still being read). */
static void *deadline_main(void *arg)
{
    struct hs_server *s = arg;
    (void)pthread_setname_np(pthread_self(), "ig-deadlines"); /* ps -L, top -H, perf */
    pthread_mutex_lock(&s->conn_mu);
    while (!s->sweeper_stop) {
        struct timespec now, until;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long cut = 0;
        for (struct hs_conn *c = s->conns; c; c = c->next) {
            long limit = c->over_limit && s->o.request_deadline_s > HS_RESERVE_DEADLINE_S
                             ? HS_RESERVE_DEADLINE_S
                             : s->o.request_deadline_s;
            if (!c->receiving || c->cut || now.tv_sec - c->since.tv_sec < limit)
                continue;
            (void)shutdown(c->fd, SHUT_RDWR);
            c->cut = 1;
            cut++;
        }
        if (cut)
            LOG(LOG_WARN, "http_request_deadline", LI("connections_closed", cut),
                LI("deadline_s", s->o.request_deadline_s));
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 500 * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->conn_cv, &s->conn_mu, &until);
    }
    pthread_mutex_unlock(&s->conn_mu);
    return NULL;
}

static int queue(struct hs_req *r, int status, struct MHD_Response *resp, int has_connection);

int hs_req_peer_closed(const struct hs_req *r)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return 0;
    struct pollfd pfd = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

int hs_req_http10(const struct hs_req *r)
{
    return r->http10;
}

void hs_req_set_gone(struct hs_req *r)
{
    atomic_store(&r->gone, 1);
}

int hs_req_gone(const struct hs_req *r)
{
    return atomic_load(&((struct hs_req *)r)->gone);
}

int hs_req_answered(const struct hs_req *r)
{
    pthread_mutex_lock(&r->srv->mu);
    int yes = r->responded || r->pending != NULL;
    pthread_mutex_unlock(&r->srv->mu);
    return yes;
}

static int respond_with(struct hs_req *r, int status, const char *content_type,
                        struct MHD_Response *resp, const char *const *headers);

int hs_respond(struct hs_req *r, int status, const char *content_type, const char *body, size_t len,
               const char *const *headers)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return -1;
    return respond_with(r, status, content_type, resp, headers);
}

int hs_respond_fd(struct hs_req *r, int status, const char *content_type, int fd,
                  unsigned long long offset, unsigned long long len, const char *const *headers)
{
    struct MHD_Response *resp = MHD_create_response_from_fd_at_offset64(len, fd, offset);
    if (!resp) {
        close(fd);
        return -1;
    }
    return respond_with(r, status, content_type, resp, headers);
}

/* A streamed body: the application's reader, behind libmicrohttpd's content reader. */
struct stream_body {
    struct hs_req *r;
    hs_stream_read_fn read;
    void *arg;
    void (*free_arg)(void *arg);
};

static ssize_t stream_body_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct stream_body *b = cls;
    long n = b->read(b->arg, b->r, pos, buf, max);
    if (n > 0)
        return (ssize_t)n;
    if (n == 0)
        return 0; /* the reader suspended the request; resumed, it is called again */
    return n == -1 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void stream_body_free(void *cls)
{
    struct stream_body *b = cls;
    if (b->free_arg)
        b->free_arg(b->arg);
    free(b);
}

int hs_respond_stream(struct hs_req *r, int status, const char *content_type,
                      const char *const *headers, hs_stream_read_fn read, void *arg,
                      void (*free_arg)(void *arg))
{
    struct stream_body *b = calloc(1, sizeof(*b));
    if (!b || tls_handling != r) {
        free(b);
        if (free_arg)
            free_arg(arg);
        return -1;
    }
    *b = (struct stream_body){.r = r, .read = read, .arg = arg, .free_arg = free_arg};
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_body_read, b,
                                          stream_body_free);
    if (!resp) {
        stream_body_free(b);
        return -1;
    }
    return respond_with(r, status, content_type, resp, headers); /* b is the response's now */
}

int hs_req_draining(const struct hs_req *r)
{
    return atomic_load(&r->srv->draining);
}

static int respond_with(struct hs_req *r, int status, const char *content_type,
                        struct MHD_Response *resp, const char *const *headers)
{
    if (content_type)
        MHD_add_response_header(resp, "Content-Type", content_type);
    MHD_add_response_header(resp, "X-Request-Id", r->request_id);
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    int has_connection = 0;
    for (const char *const *h = headers; h && h[0]; h += 2) {
        MHD_add_response_header(resp, h[0], h[1]);
        has_connection |= strcasecmp(h[0], "Connection") == 0;
    }
    if (tls_handling != r) { /* another thread: libmicrohttpd takes it when r is resumed */
        pthread_mutex_lock(&r->srv->mu);
        struct MHD_Response *old = r->pending;
        r->pending = resp;
        r->pending_status = status;
        pthread_mutex_unlock(&r->srv->mu);
        if (old)
            MHD_destroy_response(old);
        return 0;
    }
    return queue(r, status, resp, has_connection);
}

/* Queues resp (and gives up our reference); on a server thread, in the request's callback. */
static int queue(struct hs_req *r, int status, struct MHD_Response *resp, int has_connection)
{
    /* Shutting down: a kept-alive connection gets this answer and no further request. */
    if ((atomic_load(&r->srv->draining) || r->close_after) && !has_connection)
        MHD_add_response_header(resp, "Connection", "close");
    conn_receiving(r->srv, r->conn, 0);
    enum MHD_Result ok = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    r->responded = 1;
    r->status = status;
    return ok == MHD_YES ? 0 : -1;
}

/* Request smuggling defences libmicrohttpd 0.9.75 lacks: two Content-Lengths, Content-Length
 * with Transfer-Encoding, a header name holding whitespace ("Name : v"); a Transfer-Encoding
 * other than one `chunked` (libmicrohttpd then reads the body to the connection's end, a request
 * pipelined behind it swallowed into it: RFC 9112 §6.3 asks 400), or any on HTTP/1.0 (§6.1).
 * (A folded header line is refused by header_has_nul: libmicrohttpd moves its records.) */
struct framing {
    int content_length, transfer_encoding, te_not_chunked, bad_name;
};

static enum MHD_Result framing_cb(void *cls, enum MHD_ValueKind kind, const char *key,
                                  size_t key_size, const char *value, size_t value_size)
{
    (void)kind;
    (void)value_size;
    struct framing *f = cls;
    if (strcasecmp(key, "Content-Length") == 0)
        f->content_length++;
    else if (strcasecmp(key, "Transfer-Encoding") == 0) {
        f->transfer_encoding++;
        if (!value || strcasecmp(value, "chunked") != 0)
            f->te_not_chunked = 1;
    }
    if (strpbrk(key, " \t") || !*key || key_size != strlen(key))
        f->bad_name = 1;
    return MHD_YES;
}

/* A NUL byte inside a header line. libmicrohttpd 0.9.75 cuts a value at its first NUL (it
 * measures values with strlen), so neither MHD_lookup_connection_value_n nor the iterator with
 * lengths can see one: "Idempotency-Key: a\0b" arrives as "a". What it does keep is the
 * layout: each header line stays where it was read, in one buffer, its CR and LF overwritten by
 * NULs, and the records come in the order of their lines. So the bytes from the end of a value
 * to the next record's name are its line terminator — one or two NULs — and anything else there
 * is the rest of a value cut at a NUL. After the last value, the terminator is followed by the
 * empty line's, so the byte after the value's end is a NUL too. A gap too large or negative means
 * the records are not adjacent (a folded line libmicrohttpd copied elsewhere): not judged here.
 * What this cannot see: NULs only at the very end of the last header's value. */
struct nul_scan {
    const char *prev_end; /* one past the previous record's value (its first NUL) */
    int found;
};

static enum MHD_Result nul_scan_cb(void *cls, enum MHD_ValueKind kind, const char *key,
                                   size_t key_size, const char *value, size_t value_size)
{
    (void)kind;
    (void)key_size;
    struct nul_scan *ns = cls;
    if (ns->prev_end && key > ns->prev_end && key - ns->prev_end <= RL_POOL_BYTES) {
        size_t gap = (size_t)(key - ns->prev_end);
        if (gap > 2 || (gap == 2 && ns->prev_end[1] != '\0'))
            ns->found = 1;
    }
    ns->prev_end = value ? value + value_size : NULL;
    return ns->found ? MHD_NO : MHD_YES;
}

static int header_has_nul(struct MHD_Connection *conn)
{
    struct nul_scan ns = {NULL, 0};
    MHD_get_connection_values_n(conn, MHD_HEADER_KIND, nul_scan_cb, &ns);
    if (!ns.found && ns.prev_end && ns.prev_end[1] != '\0')
        ns.found = 1; /* the last value went on after a NUL */
    return ns.found;
}

static void set_request_id(struct hs_server *s, struct hs_req *r)
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

/* A request's record, made when libmicrohttpd has read its request line (on_uri) or, should
 * that allocation have failed, at its first on_request call. */
static struct hs_req *req_new(struct hs_server *s, struct MHD_Connection *conn)
{
    struct hs_req *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->srv = s;
    r->conn = conn;
    clock_gettime(CLOCK_MONOTONIC, &r->started);
    return r;
}

/* MHD_OPTION_URI_LOG_CALLBACK: called with the raw request target before libmicrohttpd splits
 * its query into per-connection records and percent-decodes its path. The path is kept as sent
 * (routes.c matches it byte for byte; the decoded URL libmicrohttpd hands on_request is never
 * used). A target the pool could not hold (reqlimit.h) is judged here, because libmicrohttpd
 * 0.9.75 never answers a request whose query exhausts the pool: the query is cut at the '?'
 * (one byte, in the line libmicrohttpd has just read and is about to parse in place) so that
 * nothing of it is parsed, and begin_request answers 414.
 *
 * A raw NUL in the target ends `uri` early. libmicrohttpd has just ended the target by writing
 * a NUL over the space before "HTTP/", so the target is whole only if that version follows its
 * end; otherwise the request is refused (400) rather than routed on what preceded the NUL. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    struct hs_req *r = req_new(cls, conn);
    size_t len = strlen(uri);
    if (r) {
        r->path = strndup(uri, strcspn(uri, "?"));
        r->target_nul = strncmp(uri + len + 1, "HTTP/", 5) != 0;
    }
    enum rl_uri_verdict v = rl_uri_check(uri, len);
    if (v != RL_URI_OK) {
        char *q = memchr(uri, '?', len);
        if (q)
            q[1] = '\0';
        if (r)
            r->refused = v;
    }
    return r;
}

/* options.reject, in the request's callback on this server thread (its answer is queued now). */
static void reject(struct hs_server *s, struct hs_req *r, enum hs_reject why)
{
    tls_handling = r;
    s->o.reject(r, why, s->o.app);
    tls_handling = NULL;
}

/* The first call of a request: its id, the target and framing checks and the body cap. */
static enum MHD_Result begin_request(struct hs_server *s, struct MHD_Connection *conn,
                                     const char *url, const char *method, const char *version,
                                     void **con_cls)
{
    struct hs_req *r = *con_cls;
    if (!r && !(r = req_new(s, conn)))
        return MHD_NO;
    *con_cls = r;
    r->begun = 1;
    r->http10 = version && strcmp(version, MHD_HTTP_VERSION_1_0) == 0;
    r->body_max = s->o.max_body_bytes;
    atomic_fetch_add(&s->in_progress, 1);
    r->method = method;
    (void)url; /* percent-decoded by libmicrohttpd: the raw path from on_uri is used instead */
    set_request_id(s, r);
    if (!r->path) { /* on_uri could not keep it (out of memory) */
        reject(s, r, HS_REJECT_NO_ANSWER);
        return r->responded ? MHD_YES : MHD_NO;
    }
    if (atomic_load(&s->draining)) {
        /* A request that arrives on a kept-alive connection once the server is quiesced is not
         * started: whatever it would record could be cut off with its connection when the
         * server stops. 503 and Connection: close; the client retries elsewhere. */
        reject(s, r, HS_REJECT_DRAINING);
        return r->responded ? MHD_YES : MHD_NO;
    }
    if (r->refused) {
        LOG(LOG_WARN, "http_request_refused", LS("request_id", r->request_id),
            LS("reason", rl_uri_verdict_name(r->refused)), LI("status", 414));
        reject(s, r, HS_REJECT_URI_TOO_LONG);
        return r->responded ? MHD_YES : MHD_NO;
    }
    struct hs_conn *c = conn_of(conn);
    if (c && c->over_limit) {
        /* A connection in the health reserve: /healthz is answered, nothing else is started;
         * either way the connection closes after its answer. */
        r->close_after = 1;
        if (strcmp(r->path, "/healthz") != 0) {
            reject(s, r, HS_REJECT_FULL);
            return r->responded ? MHD_YES : MHD_NO;
        }
    }
    if (r->target_nul) {
        reject(s, r, HS_REJECT_BAD_TARGET);
        return r->responded ? MHD_YES : MHD_NO;
    }
    struct framing f = {0, 0, 0, 0};
    MHD_get_connection_values_n(conn, MHD_HEADER_KIND, framing_cb, &f);
    if (f.content_length > 1 || (f.content_length && f.transfer_encoding) || f.bad_name ||
        f.transfer_encoding > 1 || f.te_not_chunked || (f.transfer_encoding && r->http10)) {
        reject(s, r, HS_REJECT_FRAMING);
        return r->responded ? MHD_YES : MHD_NO;
    }
    if (header_has_nul(conn)) {
        reject(s, r, HS_REJECT_HEADER_BYTES);
        return r->responded ? MHD_YES : MHD_NO;
    }
    const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Type");
    r->body_max = ct && s->o.max_upload_bytes && strncasecmp(ct, "multipart/form-data", 19) == 0 &&
                          (!s->o.upload_allowed || s->o.upload_allowed(r->path, s->o.app))
                      ? s->o.max_upload_bytes
                      : s->o.max_body_bytes;
    const char *authz = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    long long who = s->o.body_owner ? s->o.body_owner(authz, s->o.app) : HS_OWNER_OPERATOR;
    r->untrusted = who == HS_OWNER_UNKNOWN;
    r->owner = who > 0 ? who : 0;
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > (unsigned long long)r->body_max)
        r->too_large = 1;
    return MHD_YES;
}

/* Bytes of request bodies held, every server of the process together (hs_body_bytes; checked
 * against hs_options.max_buffered_bytes). */
static atomic_long body_bytes;
/* Of them, those of requests whose token hs_options.body_owner did not know (at most half of
 * max_buffered_bytes together). */
static atomic_long untrusted_bytes;

long hs_body_bytes(void)
{
    return atomic_load(&body_bytes);
}

long hs_body_bytes_untrusted(void)
{
    return atomic_load(&untrusted_bytes);
}

/* Takes more bytes of counter c, bounded by max (0 or less: no bound); 0 when they would pass
 * it. */
static int take_bytes(atomic_long *c, long more, long max)
{
    if (max > 0 && atomic_fetch_add(c, more) + more > max) {
        atomic_fetch_sub(c, more);
        return 0;
    }
    if (max <= 0)
        atomic_fetch_add(c, more);
    return 1;
}

/* Drops what the request keeps of its body, and its share of the count. */
static void drop_body(struct hs_req *r)
{
    free(r->body);
    r->body = NULL;
    r->body_len = r->body_cap = 0;
    atomic_fetch_sub(&body_bytes, r->counted);
    if (r->untrusted)
        atomic_fetch_sub(&untrusted_bytes, r->counted);
    if (r->owner && r->counted)
        bodyshare_add(r->owner, -r->counted, 0);
    r->counted = 0;
}

void hs_req_drop_body(struct hs_req *r)
{
    drop_body(r);
}

/* A piece of the body: kept while the total stays under the cap, and while the bodies of all
 * requests together stay under max_buffered_bytes. */
static enum MHD_Result add_body(struct hs_server *s, struct hs_req *r, const char *data, size_t n)
{
    if (r->responded || r->too_large || r->over_memory)
        return MHD_YES;
    if (r->body_len + n > (size_t)r->body_max) {
        /* A chunked body that grew past the cap: stop keeping it. */
        r->too_large = 1;
        drop_body(r);
        return MHD_YES;
    }
    if (r->body_len + n + 1 > r->body_cap) {
        size_t cap = r->body_cap ? r->body_cap : 4096;
        while (cap < r->body_len + n + 1)
            cap *= 2;
        /* Never past the body's own cap (and its NUL): at most body_max + 1 counted, which the
         * untrusted half holds (max_buffered_bytes is at least twice every body cap). */
        if (cap > (size_t)r->body_max + 1)
            cap = (size_t)r->body_max + 1;
        long more = (long)(cap - r->body_cap), max = s->o.max_buffered_bytes;
        if (r->untrusted && !take_bytes(&untrusted_bytes, more, max > 0 ? max / 2 + 1 : 0)) {
            r->over_memory = 1;
            drop_body(r);
            return MHD_YES;
        }
        /* The last s->reserve bytes of the bound are for a tenant's first body: a body of a
         * tenant that holds another already (or of an unknown token) stops short of them, so
         * that the tenants holding bodies together — four at their quarters — never answer a
         * tenant holding none 503. */
        int reserved = max > 0 && (!r->owner || bodyshare_of(r->owner) - r->counted > 0);
        if (r->owner && !bodyshare_add(r->owner, more, max > 0 ? s->share : 0)) {
            r->over_memory = r->over_share = 1;
            drop_body(r);
            return MHD_YES;
        }
        if (!take_bytes(&body_bytes, more, reserved ? max - s->reserve : max)) {
            if (r->untrusted)
                atomic_fetch_sub(&untrusted_bytes, more);
            if (r->owner)
                bodyshare_add(r->owner, -more, 0);
            r->over_memory = 1;
            r->over_reserve = reserved;
            drop_body(r);
            return MHD_YES;
        }
        char *nb = realloc(r->body, cap);
        if (!nb) {
            atomic_fetch_sub(&body_bytes, more);
            if (r->untrusted)
                atomic_fetch_sub(&untrusted_bytes, more);
            if (r->owner)
                bodyshare_add(r->owner, -more, 0);
            return MHD_NO;
        }
        r->counted += more;
        r->body = nb;
        r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, data, n);
    r->body_len += n;
    r->body[r->body_len] = '\0';
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    struct hs_server *s = cls;
    struct hs_req *r = *con_cls;
    if (!r || !r->begun)
        return begin_request(s, conn, url, method, version, con_cls);
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        return add_body(s, r, upload_data, n);
    }
    pthread_mutex_lock(&s->mu);
    /* Resumed while another thread still holds it (nothing does so today: the drain leaves
     * held requests to their threads, hs_stop comes after offload_close): suspended again,
     * under the lock its hs_release takes, which resumes it once that thread has let go — its
     * answer, perhaps queued already, is sent then. */
    if (r->held) {
        int added = suspended_add_locked(s, r);
        pthread_mutex_unlock(&s->mu);
        if (added)
            MHD_suspend_connection(r->conn);
        return MHD_YES;
    }
    struct MHD_Response *resp = r->pending;
    int status = r->pending_status;
    r->pending = NULL;
    pthread_mutex_unlock(&s->mu);
    if (resp) { /* answered from another thread while suspended */
        (void)queue(r, status, resp, MHD_get_response_header(resp, "Connection") != NULL);
        return MHD_YES;
    }
    if (r->responded)
        return MHD_YES;
    if (r->over_memory) {
        LOG(LOG_WARN, "http_body_memory_full", LS("request_id", r->request_id),
            LI("max_buffered_bytes", s->o.max_buffered_bytes),
            LS("bound", r->over_share     ? "tenant"
                        : r->untrusted    ? "unknown_tokens"
                        : r->over_reserve ? "reserve"
                                          : "all"));
        reject(s, r, HS_REJECT_BODY_MEMORY);
        return MHD_YES;
    }
    if (!r->suspended_once)
        conn_receiving(s, conn, 0); /* the request is whole: its deadline is met */
    tls_handling = r;
    s->o.handle(r, s->o.app);
    /* A handler either responded or suspended the connection; anything else is a bug that
     * must not leave the client hanging. */
    tls_handling = NULL;
    if (!r->responded && !r->suspended_once)
        reject(s, r, HS_REJECT_NO_ANSWER);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct hs_server *s = cls;
    struct hs_req *r = *con_cls;
    if (!r)
        return;
    pthread_mutex_lock(&s->mu); /* never on the list here; a broken invariant costs no UAF */
    suspended_remove_locked(s, r);
    pthread_mutex_unlock(&s->mu);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double secs =
        (double)(now.tv_sec - r->started.tv_sec) + (double)(now.tv_nsec - r->started.tv_nsec) / 1e9;
    if (!r->begun) {
        /* libmicrohttpd answered (or dropped) the request by itself before handing it over: a
         * header section or request line its pool could not hold (431/414), a malformed
         * request (400), or the client left. Logged once, like every other request. */
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_HTTP_STATUS);
        r->status = ci ? (int)ci->http_status : 0;
        snprintf(r->request_id, sizeof(r->request_id), "req_%s%08lx", s->id_prefix,
                 atomic_fetch_add(&request_counter, 1));
        if (r->status)
            LOG(LOG_WARN, "http_request_refused", LS("request_id", r->request_id),
                LS("reason", "refused_by_transport"), LI("status", r->status));
    }
    s->o.done(r, r->status, secs, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK, s->o.app);
    conn_receiving(s, conn, 1); /* a kept-alive connection awaits its next request from now */
    hs_req_set_state(r, NULL, NULL);
    if (r->pending)
        MHD_destroy_response(r->pending);
    free(r->path);
    drop_body(r);
    if (r->begun)
        atomic_fetch_sub(&s->in_progress, 1);
    free(r);
    *con_cls = NULL;
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

struct hs_server *hs_start(const struct hs_options *o)
{
    struct hs_server *s = calloc(1, sizeof(*s));
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    uint8_t rnd[4];
    if (!s)
        return NULL;
    s->o = *o;
    if (s->o.request_deadline_s <= 0) /* unset: libmicrohttpd's idle timeout, never 0 s */
        s->o.request_deadline_s = HS_DEFAULT_DEADLINE_S;
    s->listen_fd = -1;
    /* A tenant's share holds one body of the largest cap at least (its allocation: the cap and
     * its NUL), so that no tenant is refused every upload. */
    long largest =
        o->max_upload_bytes > o->max_body_bytes ? o->max_upload_bytes : o->max_body_bytes;
    s->share = o->max_buffered_bytes / HS_OWNER_SHARE;
    if (s->share < largest + 1)
        s->share = largest + 1;
    /* One body of the largest cap, at most a quarter of the bound (which holds two of them). */
    s->reserve = largest + 1;
    if (s->reserve > o->max_buffered_bytes / HS_OWNER_SHARE)
        s->reserve = o->max_buffered_bytes / HS_OWNER_SHARE;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->conn_mu, NULL);
    pthread_cond_init(&s->conn_cv, NULL);
    if (crypto_random(rnd, sizeof(rnd)) < 0)
        memset(rnd, 0, sizeof(rnd));
    crypto_hex(rnd, sizeof(rnd), s->id_prefix);
    if (inet_pton(AF_INET, o->host, &addr.sin_addr) != 1) {
        LOG(LOG_ERROR, "http_start_failed", LS("error", "listen host must be an IPv4 address"),
            LS("host", o->host));
        goto failed;
    }
    /* The logger comes first so that libmicrohttpd's messages about the other options reach it;
     * the pool size is the one reqlimit.h's bounds are derived from.
     *
     * poll(), not epoll: libmicrohttpd (0.9.75 and later, still open) races MHD_quiesce_daemon
     * against its own epoll loop. Both remove the listening socket from a worker's epoll set
     * without a lock, the loser gets ENOENT and MHD_PANIC aborts the process in the middle of
     * a graceful shutdown ("Failed to remove listen FD from epoll set"). With poll() quiescing
     * only sets a flag and wakes each worker; each worker then leaves the socket out of its
     * own poll set.
     *
     * The listening socket takes SO_REUSEADDR only (libmicrohttpd's default: a restart binds at
     * once past connections in TIME_WAIT), never SO_REUSEPORT (MHD_OPTION_LISTENING_ADDRESS_REUSE
     * 1): with it a second process on the same address — a stale replica, another gateway given
     * the same port — bound silently and the kernel split new connections between the two. Now
     * it is refused (http_start_failed) and exits. */
    s->daemon = MHD_start_daemon(
        MHD_USE_POLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | MHD_USE_TURBO,
        (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_THREAD_POOL_SIZE, o->threads,
        MHD_OPTION_CONNECTION_LIMIT, o->max_connections + HS_HEALTH_RESERVE,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, o->max_connections_per_address,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)30, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)RL_POOL_BYTES,
        MHD_OPTION_URI_LOG_CALLBACK, on_uri, s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_END);
    if (!s->daemon) {
        LOG(LOG_ERROR, "http_start_failed", LS("error", "cannot listen"), LS("host", o->host),
            LI("port", o->port));
        goto failed;
    }
    if (pthread_create(&s->sweeper, NULL, deadline_main, s) != 0) {
        LOG(LOG_ERROR, "http_start_failed", LS("error", "cannot start the deadline thread"));
        MHD_stop_daemon(s->daemon);
        goto failed;
    }
    s->sweeper_started = 1;
    return s;
failed:
    pthread_cond_destroy(&s->conn_cv);
    pthread_mutex_destroy(&s->conn_mu);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return NULL;
}

void hs_quiesce(struct hs_server *s)
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
static int wait_idle(struct hs_server *s, int timeout_ms)
{
    for (int waited = 0; atomic_load(&s->in_progress) > 0; waited += 10) {
        if (waited >= timeout_ms)
            return 0;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 1;
}

void hs_drain(struct hs_server *s, int timeout_ms)
{
    if (!s || wait_idle(s, timeout_ms))
        return;
    /* A slow client can hold the drain this long. A request still suspended now would be a
     * bug (every suspension has a waiter, and waiters_close woke them all), but its client
     * must still get an answer: resume it and give it a moment. Not one a database worker
     * holds: its worker resumes it (offload_close waits for them before hs_stop). */
    long n = resume_all(s, 0);
    LOG(LOG_WARN, "http_drain_timeout", LI("in_progress", atomic_load(&s->in_progress)),
        LI("resumed", n));
    if (n)
        (void)wait_idle(s, 1000);
}

void hs_stop(struct hs_server *s)
{
    if (!s)
        return;
    if (s->sweeper_started) {
        pthread_mutex_lock(&s->conn_mu);
        s->sweeper_stop = 1;
        pthread_cond_signal(&s->conn_cv);
        pthread_mutex_unlock(&s->conn_mu);
        pthread_join(s->sweeper, NULL);
    }
    if (s->daemon) {
        /* The answers of requests the database workers let go of at the drain's end (hs_drain
         * left them to their workers) are given a moment to leave. */
        (void)wait_idle(s, 1000);
        /* Nothing may stay suspended when the daemon stops (libmicrohttpd aborts). */
        long n = resume_all(s, 1);
        if (n)
            LOG(LOG_WARN, "http_resumed_at_stop", LI("requests", n));
        MHD_stop_daemon(s->daemon);
    }
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    pthread_cond_destroy(&s->conn_cv);
    pthread_mutex_destroy(&s->conn_mu);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
