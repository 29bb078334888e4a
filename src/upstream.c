#include "idemgate/upstream.h"

#include "idemgate/connguard.h"
#include "idemgate/multipart.h"

#include "idemgate/crash.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

/* Response headers kept on the operation: what a client or a retry policy needs, nothing that
 * could identify the account. */
static const char *const header_allow[] = {
    "content-type", "retry-after", "retry-after-ms", "x-request-id", "request-id",
    "openai-poll-after-ms", "location", "idempotent-replayed", "date",
};

/* One transfer: the easy handle, its header list and what is being collected. */
struct up_xfer {
    CURL *h;
    struct curl_slist *hdrs;
    struct up_response res;
    size_t max;
    size_t cap; /* bytes allocated at res.body */
    cJSON *headers;
    int (*before_send)(void *arg);
    void *before_send_arg;
    void (*on_stream)(void *arg, const char *p, size_t n);
    void *on_stream_arg;
    int stream_judged, streaming; /* the answer was looked at; it is a 2xx event stream */
    int stream_kept;              /* on_stream keeps the stream's bytes (up_request) */
    int sendings;                 /* times libcurl was about to send the request */
    int opened[4], n_opened;      /* sockets opened for this transfer (on_socket), the last 4 */
    curl_off_t uploaded;          /* the most the upload counter showed (on_progress) */
};

int up_global_init(void)
{
    return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1;
}

void up_global_fini(void)
{
    curl_global_cleanup();
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    struct up_xfer *c = arg;
    size_t len = size * n;
    struct up_response *r = &c->res;
    size_t take = len;
    if (c->on_stream && !c->stream_judged) {
        /* The status line and the headers are in by the first piece of the body. */
        long code = 0;
        const cJSON *ct = c->headers ? cJSON_GetObjectItemCaseSensitive(c->headers,
                                                                        "content-type")
                                     : NULL;
        curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &code);
        c->streaming = code >= 200 && code < 300 && cJSON_IsString(ct) &&
                       strncasecmp(ct->valuestring, "text/event-stream", 17) == 0;
        c->stream_judged = 1;
    }
    if (c->streaming) {
        c->on_stream(c->on_stream_arg, p, len);
        if (c->stream_kept)
            return len;
    }
    if (r->body_len + take > c->max) {
        take = c->max - r->body_len;
        r->body_truncated = 1;
    }
    if (take) {
        /* Grown by doubling: a long answer arrives in UP_RECV_BUFFER pieces, and growing by
         * each piece would copy it over and over (quadratic in its length). */
        if (r->body_len + take + 1 > c->cap) {
            size_t cap = up_grow_cap(c->cap, r->body_len + take + 1, c->max + 1);
            char *nb = realloc(r->body, cap);
            if (!nb)
                return 0; /* aborts the transfer with CURLE_WRITE_ERROR */
            r->body = nb;
            c->cap = cap;
        }
        memcpy(r->body + r->body_len, p, take);
        r->body_len += take;
        r->body[r->body_len] = '\0';
    }
    return len;
}

size_t up_grow_cap(size_t cap, size_t need, size_t limit)
{
    if (need > limit)
        return need; /* (never: the caller cuts what it keeps at the cap) */
    size_t c = cap ? cap : UP_RECV_BUFFER;
    if (c > limit)
        c = limit;
    while (c < need)
        c = c > limit / 2 ? limit : c * 2;
    return c;
}

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
    struct up_xfer *c = arg;
    size_t len = size * n;
    /* A new status line (after 100-continue, say) starts a new header block. */
    if (len > 5 && strncmp(p, "HTTP/", 5) == 0) {
        cJSON_Delete(c->headers);
        c->headers = cJSON_CreateObject();
        return len;
    }
    const char *colon = memchr(p, ':', len);
    if (!colon || !c->headers)
        return len;
    size_t nlen = (size_t)(colon - p);
    for (size_t i = 0; i < sizeof(header_allow) / sizeof(header_allow[0]); i++) {
        if (strlen(header_allow[i]) == nlen && strncasecmp(p, header_allow[i], nlen) == 0) {
            const char *v = colon + 1, *end = p + len;
            while (v < end && (*v == ' ' || *v == '\t'))
                v++;
            while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' '))
                end--;
            /* The value whole, however long (a Location can be long). Out of memory, the
             * header is not kept rather than the transfer (and perhaps a paid result) lost. */
            char *val = strndup(v, (size_t)(end - v));
            cJSON_DeleteItemFromObjectCaseSensitive(c->headers, header_allow[i]);
            if (val)
                cJSON_AddStringToObject(c->headers, header_allow[i], val);
            free(val);
        }
    }
    return len;
}

void up_trust_only(void *h, const char *ca_file)
{
    curl_easy_setopt(h, CURLOPT_CAINFO, ca_file);
    /* Debian's libcurl is built with a default directory of certificates too (--with-ca-path).
     * Its 7.88 leaves that out once a CA file is set (test_tls.py passes without this line);
     * said explicitly so that no build that kept it accepts a public CA's certificate for the
     * provider's host. */
    curl_easy_setopt(h, CURLOPT_CAPATH, NULL);
}

/* CURLOPT_PREREQFUNCTION: the connection exists, no request byte has left yet. The last chance
 * to refuse to send, and the exact "before send" crash point of the fault harness.
 *
 * libcurl calls it once for every sending of the request. Nothing here follows redirects,
 * negotiates authentication or expects 100-continue, and HTTP/1.1 is the only protocol, so a
 * second call within one transfer is libcurl's own re-send after a reused connection died
 * before any answer (STYLE.md): the first sending may have reached the provider and made a
 * paid task. It is refused; the evidence (the bytes that left, up_xfer_finish: the dead
 * connection's) then says whether anything had. */
static int on_prereq(void *arg, char *conn_primary_ip, char *conn_local_ip, int conn_primary_port,
                     int conn_local_port)
{
    (void)conn_local_ip;
    struct up_xfer *c = arg;
    if (++c->sendings > 1) {
        c->res.resend_refused = 1;
        return CURL_PREREQFUNC_ABORT;
    }
    /* A kept-alive connection with bytes waiting would read them as this request's answer
     * (connguard.h): this sending does not happen, and the engine starts the call again on a
     * new connection. */
    if (cg_stale(c->h, conn_primary_ip, conn_primary_port, conn_local_port)) {
        c->sendings--; /* this sending never happened: the one on a new connection is the first */
        return CURL_PREREQFUNC_ABORT;
    }
    /* A connection this transfer opened carries its first request: noted from now on, so that
     * the next request it carries is judged even if it comes before this transfer's end is
     * noted (cg_done). A reused connection opened none. */
    if (c->n_opened)
        cg_note_fresh(c->opened, c->n_opened, conn_primary_ip, conn_primary_port,
                      conn_local_port);
    CRASH_POINT("before_send");
    if (c->before_send && c->before_send(c->before_send_arg) != 0) {
        c->res.aborted_before_send = 1;
        return CURL_PREREQFUNC_ABORT;
    }
    return CURL_PREREQFUNC_OK;
}

/* CURLOPT_SOCKOPTFUNCTION: every connection to a provider ends with a reset, never a graceful
 * close. A create abandoned before its answer (a timeout) would otherwise leave whatever the
 * provider has not acknowledged in this host's send queue, and the kernel goes on retransmitting
 * it after the close, for minutes: a provider that was not reading (a full accept queue, a lost
 * segment) could receive the request after the reconciler had proved its task absent and resent
 * it. A reset drops it, so an attempt's bytes travel only while the attempt runs. libcurl closes
 * the connection of a transfer that did not end whole (an error, a timeout, a transfer removed
 * early) instead of keeping it; one kept alive carried an exchange that ended, its request read
 * and answered. */
static int on_socket(void *arg, curl_socket_t fd, curlsocktype purpose)
{
    struct up_xfer *x = arg; /* NULL: a handle of up_reset_on_close */
    if (purpose == CURLSOCKTYPE_IPCXN) {
        struct linger abort_on_close = {.l_onoff = 1, .l_linger = 0};
        (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof(abort_on_close));
        /* A socket opened for this transfer: its connection is noted at its first request
         * (on_prereq, cg_note_fresh). */
        if (x) {
            if (x->n_opened == 4) {
                memmove(x->opened, x->opened + 1, 3 * sizeof(x->opened[0]));
                x->n_opened = 3;
            }
            x->opened[x->n_opened++] = fd;
        }
    }
    return CURL_SOCKOPT_OK;
}

/* CURLOPT_XFERINFOFUNCTION: what the upload counter shows, kept. CURLINFO_REQUEST_SIZE counts
 * only what the request's first write took: when that write takes nothing (TLS without partial
 * writes, a request larger than the socket's free buffer), the whole request leaves later
 * through the upload path, counted there — and that counter is reset when libcurl goes to send
 * the request again, before on_prereq refuses it. The most it showed stays here. */
static int on_progress(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    (void)dltotal;
    (void)dlnow;
    (void)ultotal;
    struct up_xfer *c = arg;
    if (ulnow > c->uploaded)
        c->uploaded = ulnow;
    return 0;
}

void up_reset_on_close(void *h)
{
    curl_easy_setopt((CURL *)h, CURLOPT_SOCKOPTFUNCTION, on_socket);
}

/* Appends one header line to *list. The line is built exactly as long as it needs to be: a 2 KB
 * provider token is never cut (a cut token reads as 401 and trips the credential for every
 * tenant). Our copy is zeroed before it is freed, since it may hold the credential. Returns 0,
 * or -1 when out of memory (*list is then unchanged). */
__attribute__((warn_unused_result)) static int add_header(struct curl_slist **list,
                                                          const char *name, const char *value)
{
    size_t n = strlen(name) + 2 + strlen(value) + 1;
    char *line = malloc(n);
    if (!line)
        return -1;
    snprintf(line, n, "%s: %s", name, value);
    struct curl_slist *nl = curl_slist_append(*list, line);
    explicit_bzero(line, n);
    free(line);
    if (!nl)
        return -1;
    *list = nl;
    return 0;
}

/* Appends a fixed line ("Expect:" removes a header libcurl would add). Returns 0 or -1. */
__attribute__((warn_unused_result)) static int add_line(struct curl_slist **list, const char *line)
{
    struct curl_slist *nl = curl_slist_append(*list, line);
    if (!nl)
        return -1;
    *list = nl;
    return 0;
}

/* Frees the header list after zeroing libcurl's copies of the lines (one holds the
 * credential). */
static void free_headers(struct curl_slist *list)
{
    for (struct curl_slist *e = list; e; e = e->next)
        explicit_bzero(e->data, strlen(e->data));
    curl_slist_free_all(list);
}

/* The request's header lines: ours, the credential, then the caller's. Returns 0 with the list
 * in *out, or -1 when out of memory (nothing is left allocated). */
__attribute__((warn_unused_result)) static int build_headers(const struct up_request *req,
                                                             struct curl_slist **out)
{
    struct curl_slist *l = NULL;
    *out = NULL;
    /* A stored body is JSON, or a multipart upload recorded as the client sent it, whose own
     * first line names its boundary (multipart.h): the type goes with the bytes. */
    char ctype[MP_CTYPE_MAX + sizeof("Content-Type: ")];
    memcpy(ctype, "Content-Type: ", sizeof("Content-Type: "));
    if (req->body &&
        !mp_content_type_of(req->body, req->body_len, ctype + sizeof("Content-Type: ") - 1,
                            MP_CTYPE_MAX))
        memcpy(ctype, "Content-Type: application/json", sizeof("Content-Type: application/json"));
    if (req->body && add_line(&l, ctype) < 0)
        goto failed;
    if (add_line(&l, "Accept: application/json") < 0 ||
        add_line(&l, "Expect:") < 0) /* no 100-continue round trip */
        goto failed;
    if (req->auth_header && req->auth_value &&
        add_header(&l, req->auth_header, req->auth_value) < 0)
        goto failed;
    for (const char *const *x = req->headers; x && x[0] && x[1]; x += 2)
        if (add_header(&l, x[0], x[1]) < 0)
            goto failed;
    *out = l;
    return 0;
failed:
    free_headers(l);
    return -1;
}

int up_xfer_new(const struct up_request *req, struct up_xfer **out, struct up_response *res)
{
    struct up_xfer *x = calloc(1, sizeof(*x));
    *out = NULL;
    memset(res, 0, sizeof(*res));
    if (!x || !(x->h = curl_easy_init()) || !(x->headers = cJSON_CreateObject()) ||
        build_headers(req, &x->hdrs) < 0) {
        /* Nothing was sent: the request could not even be built. */
        res->curl_code = CURLE_OUT_OF_MEMORY;
        snprintf(res->error, sizeof(res->error), "out of memory");
        if (x) {
            cJSON_Delete(x->headers);
            if (x->h)
                curl_easy_cleanup(x->h);
            free(x);
        }
        return -1;
    }
    x->max = req->max_response_bytes;
    x->before_send = req->before_send;
    x->before_send_arg = req->before_send_arg;
    x->on_stream = req->on_stream;
    x->on_stream_arg = req->on_stream_arg;
    x->stream_kept = req->on_stream && req->stream_kept;
    CURL *h = x->h;
    curl_easy_setopt(h, CURLOPT_URL, req->url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req->method);
    if (strcmp(req->method, "GET") == 0) {
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
    } else if (req->body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, req->body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, x->hdrs);
    /* Only the configured proxy, never the environment's: an empty CURLOPT_PROXY disables
     * http_proxy / HTTPS_PROXY / ALL_PROXY, and NOPROXY "*" exempts every host besides. A
     * configured proxy carries every call: NOPROXY "" overrides the environment's NO_PROXY. */
    curl_easy_setopt(h, CURLOPT_PROXY, req->proxy ? req->proxy : "");
    curl_easy_setopt(h, CURLOPT_NOPROXY, req->proxy ? "" : "*");
    if (req->ca_file)
        up_trust_only(h, req->ca_file);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    /* HTTP/1.1 only: one exchange on a connection at a time, so a call that is abandoned closes
     * its connection and whatever it had not sent goes with it (on_socket); HTTP/2 would keep
     * the connection, and an abandoned request's queued bytes, for the next call. */
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    if (req->keepalive_seconds > 0) {
        /* libcurl keeps a connection whose whole seconds idle do not exceed MAXAGE_CONN. */
        curl_easy_setopt(h, CURLOPT_MAXAGE_CONN, req->keepalive_seconds - 1);
    } else {
        curl_easy_setopt(h, CURLOPT_FRESH_CONNECT, 1L);
        curl_easy_setopt(h, CURLOPT_FORBID_REUSE, 1L);
    }
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, req->connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, req->total_timeout_ms);
    /* A transfer mostly waits: a small receive buffer keeps thousands of them in flight cheap
     * (a large answer takes more reads, not more memory per waiting call). */
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, (long)UP_RECV_BUFFER);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_SOCKOPTFUNCTION, on_socket);
    curl_easy_setopt(h, CURLOPT_SOCKOPTDATA, x);
    cg_install(h);
    curl_easy_setopt(h, CURLOPT_PREREQFUNCTION, on_prereq);
    curl_easy_setopt(h, CURLOPT_PREREQDATA, x);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, x);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "idemgate/0.1");
    curl_easy_setopt(h, CURLOPT_PRIVATE, x);
    *out = x;
    return 0;
}

void *up_xfer_easy(struct up_xfer *x)
{
    return x->h;
}

void up_xfer_restart(struct up_xfer *x)
{
    /* Refused before its first byte: nothing was sent or received, and libcurl resets its
     * counters when the transfer starts again. */
    x->uploaded = 0;
    x->n_opened = 0;
    curl_easy_setopt(x->h, CURLOPT_FRESH_CONNECT, 1L);
}

int up_xfer_finish(struct up_xfer *x, int curl_code, struct up_response *res)
{
    CURL *h = x->h;
    long status = 0, reqsize = 0, hdrsize = 0;
    curl_off_t uploaded = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(h, CURLINFO_REQUEST_SIZE, &reqsize);
    curl_easy_getinfo(h, CURLINFO_HEADER_SIZE, &hdrsize);
    /* The upload counter as it ended (a write that failed after others in the same turn was
     * never shown to on_progress), or the most on_progress saw (a retry resets it). */
    curl_easy_getinfo(h, CURLINFO_SIZE_UPLOAD_T, &uploaded);
    if (x->uploaded > uploaded)
        uploaded = x->uploaded;
    if (uploaded > reqsize)
        reqsize = uploaded > LONG_MAX ? LONG_MAX : (long)uploaded;
    *res = x->res;
    res->curl_code = curl_code;
    res->http_status = (int)status;
    res->bytes_sent = reqsize;
    res->header_bytes = hdrsize;
    if (curl_code != CURLE_OK)
        snprintf(res->error, sizeof(res->error), "curl %d: %s", curl_code,
                 curl_easy_strerror((CURLcode)curl_code));
    res->headers_json = cJSON_PrintUnformatted(x->headers);
    cJSON_Delete(x->headers);
    free_headers(x->hdrs);
    curl_easy_cleanup(h);
    free(x);
    return curl_code == CURLE_OK && status > 0 ? 0 : -1;
}

int up_xfer_perform(struct up_xfer *x, struct up_response *res)
{
    CURLcode cc = curl_easy_perform(x->h);
    if (cc == CURLE_ABORTED_BY_CALLBACK && cg_take_refused(x->h)) {
        up_xfer_restart(x);
        cc = curl_easy_perform(x->h);
    }
    cg_done(x->h);
    return up_xfer_finish(x, (int)cc, res);
}

int up_call(const struct up_request *req, struct up_response *res)
{
    struct up_xfer *x;
    if (up_xfer_new(req, &x, res) < 0)
        return -1;
    return up_xfer_perform(x, res);
}

void up_response_fini(struct up_response *res)
{
    free(res->headers_json);
    free(res->body);
    memset(res, 0, sizeof(*res));
}
