#ifndef IDEMGATE_UPSTREAM_H
#define IDEMGATE_UPSTREAM_H

#include <stddef.h>

/* One outbound HTTP call with libcurl, and the evidence of what happened on the wire.
 *
 * Connections are kept alive between calls (HTTP/1.1, one exchange at a time, for at most
 * keepalive_seconds idle). libcurl 7.88 silently re-sends a request on a new connection when a
 * reused one dies before any answer (STYLE.md) — a POST that reached the provider would be paid
 * twice. Every request passes libcurl's pre-request callback once per sending, so a second
 * sending within one call is that re-send: it is refused (up_response.resend_refused), and the
 * call's evidence says whether the first one left any byte (classify.h). A kept-alive
 * connection with bytes waiting never carries a request (connguard.h): the call starts again
 * on a new connection (up_xfer_restart). */

struct up_request {
    const char *method;
    const char *url;
    const char *auth_header; /* e.g. "Authorization", or NULL */
    const char *auth_value;  /* prefix + secret; never logged */
    const char *const *headers; /* more request headers: name, value, …, NULL; or NULL */
    const char *body;
    size_t body_len;
    long connect_timeout_ms;
    long total_timeout_ms;
    /* A connection idle for less than this many seconds carries the next call; 0: every call
     * has a connection of its own, closed when it ends. */
    long keepalive_seconds;
    size_t max_response_bytes;
    /* The proxy to use ("http://host:port", "socks5h://…"), or NULL for a direct connection.
     * The environment (http_proxy, HTTPS_PROXY, ALL_PROXY, NO_PROXY) is never consulted: a
     * proxy nobody configured could turn a timeout into a definite 502/504 and would see the
     * credential. */
    const char *proxy;
    /* The CA bundle that authenticates the provider's origin (PEM), or NULL: the system's. */
    const char *ca_file;
    /* Called by libcurl after the connection is made and just before the request is sent. A
     * nonzero return aborts the transfer with nothing sent (a lease that ran out, say). */
    int (*before_send)(void *arg);
    void *before_send_arg;
    /* Each piece of a 2xx text/event-stream answer as it arrives, besides being collected into
     * the response's body (on the thread performing the transfer: it must not block), or NULL.
     * An answer of another status or type is never passed on. */
    void (*on_stream)(void *arg, const char *p, size_t n);
    void *on_stream_arg;
    /* 1: on_stream keeps a 2xx event stream's bytes (the live stream, livestream.h), so the
     * response's body does not collect them a second time (it stays empty). */
    int stream_kept;
};

struct up_response {
    int curl_code;
    long bytes_sent;   /* bytes of the request that left: CURLINFO_REQUEST_SIZE, or what the
                        * upload counted if more (up_xfer_finish) */
    long header_bytes; /* CURLINFO_HEADER_SIZE */
    int http_status;
    int aborted_before_send; /* nothing left: before_send refused, or prov_xfer_new could not
                              * build the request (its secret gone, out of memory) */
    int resend_refused;      /* libcurl was about to send the request a second time: refused */
    char *headers_json;      /* allow-listed response headers as a JSON object (owned) */
    char *body;              /* owned, NUL-terminated, body_len bytes */
    size_t body_len;
    int body_truncated; /* longer than max_response_bytes: the rest was dropped */
    char error[256];    /* libcurl's message; never holds request data */
};

/* Global libcurl set-up, once, before any thread starts. Returns 0 or -1. */
__attribute__((warn_unused_result)) int up_global_init(void);
void up_global_fini(void);

/* Performs the call. Always fills *res (free it with up_response_fini); returns 0 when a
 * response with a status line arrived, -1 otherwise (the evidence says how far it got). When
 * the request cannot even be built (out of memory), nothing is sent: curl_code is
 * CURLE_OUT_OF_MEMORY and bytes_sent 0. Header lines have no length limit. */
__attribute__((warn_unused_result)) int up_call(const struct up_request *req,
                                                struct up_response *res);
void up_response_fini(struct up_response *res);

/* The same call in two halves, for an event loop (engine.h) that drives many at once: the
 * transfer is built (nothing is sent), performed by whoever owns its easy handle, then finished.
 * The CURLOPT_PRIVATE of the easy handle is the transfer. req's body and before_send_arg must
 * stay valid until the transfer is finished; everything else is copied. */
struct up_xfer;
/* The receive buffer of each transfer (libcurl's default is 16 KiB). */
#define UP_RECV_BUFFER 8192
/* The capacity an answer's buffer grows to so that need bytes fit (cap: what it has, 0 at
 * first): doubled from UP_RECV_BUFFER (an answer arriving in pieces is not copied over and
 * over), but never past limit (the answer's cap and its NUL: a 17 MiB answer under a 16 MiB cap
 * holds 16 MiB + 1, not 32). need <= limit. Pure. */
size_t up_grow_cap(size_t cap, size_t need, size_t limit);
/* Builds the transfer into *out. Returns 0, or -1 when out of memory, with *res filled as
 * up_call fills it for a request that could not be built (nothing sent; *out is NULL). */
__attribute__((warn_unused_result)) int up_xfer_new(const struct up_request *req,
                                                    struct up_xfer **out,
                                                    struct up_response *res);
/* The transfer's CURL easy handle. */
void *up_xfer_easy(struct up_xfer *x);
/* After x's transfer ended because its connection was refused (cg_take_refused): readies it to
 * be started again, on a new connection, as if never started. */
void up_xfer_restart(struct up_xfer *x);
/* Makes every connection the easy handle h opens end with a reset, as the provider calls' do:
 * for other transfers on the call engine (archive copies), whose connections a provider's call
 * may reuse. */
void up_reset_on_close(void *h);
/* Makes the easy handle h trust only the certificates of ca_file (PEM) — a provider's private CA
 * (tls.ca_file) — neither the system's bundle nor its directory. */
void up_trust_only(void *h, const char *ca_file);
/* Reads the evidence of a transfer libcurl ended with curl_code into *res and frees the
 * transfer (the easy handle must no longer be in a multi handle). Returns what up_call
 * returns. */
int up_xfer_finish(struct up_xfer *x, int curl_code, struct up_response *res);
/* Performs the transfer on the calling thread (blocking) and finishes it. */
int up_xfer_perform(struct up_xfer *x, struct up_response *res);

#endif
