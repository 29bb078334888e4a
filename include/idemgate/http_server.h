#ifndef IDEMGATE_HTTP_SERVER_H
#define IDEMGATE_HTTP_SERVER_H

#include <stddef.h>

/* The HTTP transport: libmicrohttpd and nothing above it. It accepts connections, checks the
 * request framing, accumulates the body under a cap, hands each complete request to one
 * application callback, suspends and resumes requests, and queues responses. It knows no route,
 * no database and no problem format: the application (api.c) supplies them through the
 * callbacks of struct hs_options. */

struct hs_server;
struct hs_req;

/* Why the transport could not let the application answer a request normally. */
enum hs_reject {
    HS_REJECT_FRAMING = 1,  /* conflicting Content-Length/Transfer-Encoding, or a malformed header
                               name: answer 400 (the connection is closed after it) */
    HS_REJECT_NO_ANSWER,    /* the handler neither answered nor suspended: answer 500 */
    HS_REJECT_DRAINING,     /* a new request after hs_quiesce (on a kept-alive connection):
                               answer 503 (the connection is closed after it) */
    HS_REJECT_URI_TOO_LONG, /* a request target the connection's memory could not hold (longer
                               than RL_URI_MAX_BYTES or more than RL_QUERY_PARAMS_MAX query
                               parameters, reqlimit.h): answer 414 (the connection is closed) */
    HS_REJECT_HEADER_BYTES, /* a NUL byte inside a header line (libmicrohttpd would hand the value
                               over cut at it): answer 400 (the connection is closed) */
    HS_REJECT_BAD_TARGET,   /* a NUL byte inside the request target: answer 400 */
    HS_REJECT_FULL,         /* max_connections are open: this connection is in the health
                               reserve, where only /healthz is served: answer 503 (the
                               connection is closed) */
    HS_REJECT_BODY_MEMORY,  /* the bodies held in memory, all requests together, would pass
                               max_buffered_bytes with this one's: its bytes were dropped as they
                               came; answer 503 with Retry-After */
};

/* Whose a request's body is (hs_options.body_owner). */
#define HS_OWNER_UNKNOWN 0
#define HS_OWNER_OPERATOR (-1)
/* One tenant's bodies, every server of the process together, hold at most
 * max_buffered_bytes / HS_OWNER_SHARE — or one body of the largest cap, when that is more. */
#define HS_OWNER_SHARE 4

/* Bytes of request bodies held in memory now, by every server of the process; of them, those of
 * requests whose token body_owner did not recognise. */
long hs_body_bytes(void);
long hs_body_bytes_untrusted(void);

/* Connections accepted above max_connections, for /healthz alone (each closed after one answer
 * and held HS_RESERVE_DEADLINE_S at most), so that health is answered when the server is full. */
#define HS_HEALTH_RESERVE 8
#define HS_RESERVE_DEADLINE_S 2
/* request_deadline_s when a listener leaves it unset (0 was taken as "cut at the next sweep"). */
#define HS_DEFAULT_DEADLINE_S 30

struct hs_options {
    const char *host; /* an IPv4 address */
    int port;
    unsigned threads;
    unsigned max_connections;
    unsigned max_connections_per_address; /* more from one IP address are closed at once */
    /* A request's headers and body must have arrived this many seconds after the connection was
     * accepted or its previous request ended; otherwise the connection is closed (0: 30 s). */
    int request_deadline_s;
    long max_body_bytes; /* a longer body is dropped and hs_req_body_too_large() says so */
    long max_upload_bytes; /* the same for a multipart/form-data body (0: max_body_bytes) */
    /* The bodies kept in memory while they arrive and until their request ends, all requests
     * together, at most (0: no limit): a body that would pass it is dropped as it comes and its
     * request rejected (HS_REJECT_BODY_MEMORY), before anything of it is read by the handler —
     * clients that send bodies without a valid token cannot exhaust memory. The bodies of
     * requests body_owner does not recognise hold at most half of it together, so that clients
     * without a valid token cannot take it all from those with one either; and one owner's
     * (a tenant's) at most a quarter of it (HS_OWNER_SHARE), so that one tenant cannot take it
     * from the others. */
    long max_buffered_bytes;
    /* Whose the request's Authorization header (NULL: none) is, read before any byte of its body:
     * HS_OWNER_UNKNOWN (no token the application knows), HS_OWNER_OPERATOR, or a tenant's id
     * (> 0). NULL: every request is the operator's. */
    long long (*body_owner)(const char *authorization, void *app);
    /* Whether the request path (as sent) may carry an upload: only then does a multipart body
     * get max_upload_bytes, before anything else of the request is read. NULL: every path. */
    int (*upload_allowed)(const char *path, void *app);
    void *app;           /* passed to every callback */
    /* Called on a server thread once the body is complete, and once more after each
     * resumption of a suspended request. It must answer (hs_respond) or suspend (hs_suspend). */
    void (*handle)(struct hs_req *r, void *app);
    /* Called instead of handle (framing) or after it (no answer); it must answer. */
    void (*reject)(struct hs_req *r, enum hs_reject why, void *app);
    /* Called once per request when it is over, before its state is freed: status is that of
     * the queued response (0 if none), completed is 1 when the response was sent in full. */
    void (*done)(struct hs_req *r, int status, double seconds, int completed, void *app);
};

/* Starts listening; o is copied. Returns NULL when it cannot listen. */
__attribute__((warn_unused_result)) struct hs_server *hs_start(const struct hs_options *o);

/* The shutdown, in this order (the application's own steps go between them):
 *   hs_quiesce  stop accepting: new connections are refused (ECONNREFUSED) and those not yet
 *               accepted are reset, never left queued; requests in progress continue and every
 *               answer from now on closes its connection, so kept-alive clients go away; a new
 *               request on a kept-alive connection is not started (options.reject with
 *               HS_REJECT_DRAINING).
 *   (the application wakes whatever it suspended and stops suspending)
 *   hs_drain    wait up to timeout_ms for the requests in progress to be answered; a request
 *               still suspended then is resumed (and answered) rather than left behind.
 *   hs_stop     resume whatever is still suspended, stop libmicrohttpd (no server thread runs
 *               afterwards, so no callback is called any more), close the listening socket,
 *               free the server.
 * Each accepts NULL and does nothing twice. */
void hs_quiesce(struct hs_server *s);
void hs_drain(struct hs_server *s, int timeout_ms);
void hs_stop(struct hs_server *s);

/* The request, for the application's callbacks. Strings live as long as the request. */
const char *hs_req_method(const struct hs_req *r);
/* The path as the client sent it: not percent-decoded, without the query (routes.c judges it
 * with rawpath.h). */
const char *hs_req_path(const struct hs_req *r);
/* The client's X-Request-Id when it is well formed (1..64 of [A-Za-z0-9._-]), else a new one. */
const char *hs_req_id(const struct hs_req *r);
const char *hs_req_header(const struct hs_req *r, const char *name);
/* A header's value and its length in *len (not NUL-assumed), or NULL when absent. A request whose
 * header lines hold a NUL never reaches the application (HS_REJECT_HEADER_BYTES). */
const char *hs_req_header_n(const struct hs_req *r, const char *name, size_t *len);
/* How many times header `name` occurs (case-insensitive). */
int hs_req_header_count(const struct hs_req *r, const char *name);
/* A query-string argument, or NULL. */
const char *hs_req_query(const struct hs_req *r, const char *name);
/* The first query-string argument that is not one of known (NULL-terminated, at most 32
 * names) or is given twice (*repeated 1); NULL when every argument is known and given once. */
const char *hs_req_query_check(const struct hs_req *r, const char *const *known, int *repeated);
/* The body (not NUL-terminated as far as the contract goes; "" when empty). */
const char *hs_req_body(const struct hs_req *r, size_t *len);
int hs_req_body_too_large(const struct hs_req *r);
/* Frees r's body, uncounted from the bound all requests' bodies share (max_buffered_bytes): for
 * a request that no longer reads it (hs_req_body is "" from then on). */
void hs_req_drop_body(struct hs_req *r);

/* The application's state of this request: NULL until set. free_fn(state) is called when the
 * request is over, after options.done; setting another state frees the previous one. */
void *hs_req_state(const struct hs_req *r);
void hs_req_set_state(struct hs_req *r, void *state, void (*free_fn)(void *state));

/* Suspends the request until hs_resume(r) (from any thread); options.handle is then called again
 * with the same request. Every suspension must be paired with a way out: a registered waker, or
 * an immediate hs_resume when none could be registered. hs_resume after the request was already
 * resumed (by hs_drain or hs_stop at shutdown) does nothing. */
void hs_suspend(struct hs_req *r);
void hs_resume(void *r);
/* hs_suspend for a request another thread now holds (works on, and answers): nothing resumes it
 * until that thread calls hs_release (hs_drain leaves it; resumed, a connection whose client has
 * gone is closed and the request freed at once, under that thread), and a resumption that came
 * anyway suspends it again before anything else — its answer, queued meanwhile, included.
 * hs_release lets go of it and resumes it; that thread must not touch it afterwards. */
void hs_suspend_held(struct hs_req *r);
void hs_release(struct hs_req *r);

/* Queues the response. headers: NULL-terminated list of name, value pairs (a NULL name ends it);
 * may be NULL. Adds X-Request-Id and Cache-Control: no-store, and Connection: close once the
 * server is quiesced. Returns 0 or -1. A suspended request may be answered from any thread (one
 * thread at a time): the response is kept and queued when it is resumed, instead of calling
 * options.handle again — the answering thread then calls hs_resume. */
/* A streamed body's reader: copies up to max bytes from offset pos into buf and returns how
 * many (> 0); or, when none is there yet, suspends r itself (hs_suspend, with a way out, as
 * always) and returns 0 — it is called again once r is resumed; or returns -1 at the end of the
 * body, -2 to close the connection without ending it (the client sees a cut body). Called on a
 * server thread. */
typedef long (*hs_stream_read_fn)(void *arg, struct hs_req *r, unsigned long long pos, char *buf,
                                  size_t max);
/* Queues a response whose body (chunked) comes from read(arg, …) as it becomes available;
 * free_arg(arg) when it is done with (free_arg may be NULL). Only on the server thread handling
 * r. Returns 0 or -1; arg is taken either way (free_arg has run, or will). */
int hs_respond_stream(struct hs_req *r, int status, const char *content_type,
                      const char *const *headers, hs_stream_read_fn read, void *arg,
                      void (*free_arg)(void *arg));
/* 1 once the server is quiesced (hs_quiesce): a stream in progress should end. */
int hs_req_draining(const struct hs_req *r);
/* Whether the client closed (or reset) its side of r's connection: a suspended request nobody
 * waits for any more. From any thread, while r lives. */
int hs_req_peer_closed(const struct hs_req *r);
/* Marks r as found with its client gone (by whoever checked hs_req_peer_closed while it was
 * suspended), so that its handler ends it when resumed; hs_req_gone reads the mark. */
void hs_req_set_gone(struct hs_req *r);
/* Whether r came as HTTP/1.0: a body of unknown length then ends with the connection, so a cut
 * cannot be told from an end (a live stream is not relayed to it: it gets the record). */
int hs_req_http10(const struct hs_req *r);
int hs_req_gone(const struct hs_req *r);
/* Whether r has an answer, queued or waiting for its resumption. */
int hs_req_answered(const struct hs_req *r);
int hs_respond(struct hs_req *r, int status, const char *content_type, const char *body, size_t len,
               const char *const *headers);
/* hs_respond with a body of len bytes read from fd at offset, streamed by libmicrohttpd (a large
 * file is never read into memory); fd is owned by the response from here on, and closed. */
int hs_respond_fd(struct hs_req *r, int status, const char *content_type, int fd,
                  unsigned long long offset, unsigned long long len, const char *const *headers);

#endif
