#include "idemgate/outputs.h"

#include "idemgate/archive.h"
#include "idemgate/archread.h"
#include "idemgate/crypto.h"
#include "idemgate/log.h"
#include "idemgate/reply.h"
#include "idemgate/store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* Digits only, no sign, no overflow: 0 and the value, or -1. */
static int parse_pos(const char *s, size_t n, long long *out)
{
    long long v = 0;
    if (n == 0 || n > 18)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

int out_range(const char *hdr, long long size, long long *first, long long *last)
{
    *first = 0;
    *last = size - 1;
    if (!hdr || strncmp(hdr, "bytes=", 6) != 0)
        return OUT_RANGE_NONE;
    const char *spec = hdr + 6, *dash = strchr(spec, '-');
    if (!dash || strchr(spec, ','))
        return OUT_RANGE_NONE;
    long long a = 0, b = 0;
    size_t la = (size_t)(dash - spec), lb = strlen(dash + 1);
    if (la == 0) { /* a suffix: the last b bytes */
        if (parse_pos(dash + 1, lb, &b) < 0)
            return OUT_RANGE_NONE;
        if (b == 0 || size == 0)
            return OUT_RANGE_UNSATISFIABLE;
        *first = b >= size ? 0 : size - b;
        *last = size - 1;
        return OUT_RANGE_PARTIAL;
    }
    if (parse_pos(spec, la, &a) < 0 || (lb && parse_pos(dash + 1, lb, &b) < 0))
        return OUT_RANGE_NONE;
    if (lb && b < a)
        return OUT_RANGE_NONE; /* invalid: ignored */
    if (a >= size)
        return OUT_RANGE_UNSATISFIABLE;
    *first = a;
    *last = lb && b < size ? b : size - 1;
    return OUT_RANGE_PARTIAL;
}

/* The media types a browser may render inline from the console's origin: raster images, video
 * and audio, which run no script. SVG (script, links), HTML, XML, PDF and anything else are
 * downloads. Compared on the type before its parameters, case-insensitively. */
static const char *const inline_types[] = {
    "image/png",  "image/jpeg", "image/gif",  "image/webp", "image/avif", "video/mp4",
    "video/webm", "video/ogg",  "audio/mpeg", "audio/mp4",  "audio/ogg",  "audio/wav",
    "audio/webm", "audio/flac", "audio/aac",
};

int out_inline_type(const char *content_type)
{
    if (!content_type)
        return 0;
    size_t n = strcspn(content_type, "; \t");
    for (size_t i = 0; i < sizeof(inline_types) / sizeof(inline_types[0]); i++)
        if (strlen(inline_types[i]) == n && strncasecmp(content_type, inline_types[i], n) == 0)
            return 1;
    return 0;
}

/* 1 when an If-None-Match value names etag (or is "*"). */
static int etag_matches(const char *inm, const char *etag)
{
    return inm && (strcmp(inm, "*") == 0 || strstr(inm, etag) != NULL);
}

/* The output's job id and index from the path, or a 404 (answered) and -1. */
static int output_ref(struct hs_req *r, const struct api_args *a, char *id, size_t id_cap,
                      long long *n)
{
    char nbuf[16];
    if (api_arg(a, 0, id, id_cap) <= 0 || api_arg(a, 1, nbuf, sizeof(nbuf)) <= 0 ||
        parse_pos(nbuf, strlen(nbuf), n) < 0 || *n > 100000) {
        reply_problem(r, 404, "job-not-found", "Job not found", "no job with this id", 0);
        return -1;
    }
    return 0;
}

/* 404 for an output that does not exist or is not archived: its archive state in the detail. */
static void reply_not_archived(struct hs_req *r, const struct archive_output *o, long long n)
{
    char detail[600];
    if (!o->exists)
        snprintf(detail, sizeof(detail),
                 o->planned ? "this job has no output %lld"
                            : "output %lld is not archived yet: the job's outputs are not planned",
                 n);
    else
        snprintf(detail, sizeof(detail), "output %lld is not archived: archive state %s%s%.400s",
                 n, o->state, o->last_error ? ", last error: " : "",
                 o->last_error ? o->last_error : "");
    int not_archived = o->exists || !o->planned;
    reply_problem(r, 404, not_archived ? "output-not-archived" : "output-not-found",
                  not_archived ? "Output not archived" : "Output not found", detail, 0);
}

/* The headers every answer carrying (or validating) the bytes gets, the provider's type being
 * untrusted on the console's origin: no sniffing, a sandbox with no script and no origin, and a
 * download for any type outside the inline allow-list. h holds 8 entries; extra (name, value
 * pairs, NULL-terminated, at most 3 pairs) are appended. */
static void object_headers(const char *ct, const char *etag, const char **extra, const char **h)
{
    int i = 0;
    h[i++] = "ETag";
    h[i++] = etag;
    h[i++] = "X-Content-Type-Options";
    h[i++] = "nosniff";
    h[i++] = "Content-Security-Policy";
    h[i++] = "sandbox";
    if (!out_inline_type(ct)) {
        h[i++] = "Content-Disposition";
        h[i++] = "attachment";
    }
    for (; extra && extra[0]; extra += 2) {
        h[i++] = extra[0];
        h[i++] = extra[1];
    }
    h[i] = NULL;
}

/* The bytes of fd (size long), whole (200) or one range (206); 416 with Content-Range for a
 * range past the end. fd is owned from here on. */
static void send_object(struct hs_req *r, const char *ct, const char *etag, int fd,
                        long long size)
{
    long long first, last;
    const char *h[16];
    char cr[96];
    /* If-Range with another validator: the whole representation (RFC 9110 §13.1.5). */
    const char *ifr = hs_req_header(r, "If-Range");
    int rr = ifr && strcmp(ifr, etag) != 0
                 ? OUT_RANGE_NONE
                 : out_range(hs_req_header(r, "Range"), size, &first, &last);
    if (rr == OUT_RANGE_UNSATISFIABLE) {
        close(fd);
        char detail[96];
        snprintf(detail, sizeof(detail), "the output is %lld bytes long", size);
        snprintf(cr, sizeof(cr), "bytes */%lld", size);
        const char *extra[] = {"Content-Range", cr, NULL};
        reply_problem_with(r, 416, "range-not-satisfiable", "Range not satisfiable", detail,
                           extra);
    } else if (rr == OUT_RANGE_PARTIAL) {
        snprintf(cr, sizeof(cr), "bytes %lld-%lld/%lld", first, last, size);
        const char *extra[] = {"Content-Range", cr, "Accept-Ranges", "bytes", NULL};
        object_headers(ct, etag, extra, h);
        hs_respond_fd(r, 206, ct, fd, (unsigned long long)first,
                      (unsigned long long)(last - first + 1), h);
    } else {
        const char *extra[] = {"Accept-Ranges", "bytes", NULL};
        object_headers(ct, etag, extra, h);
        hs_respond_fd(r, 200, ct, fd, 0, (unsigned long long)size, h);
    }
}

/* Output n of the job (tenant_id, id): its bytes, a 304, or the problem that says why not. */
static void serve(struct hs_req *r, long long tenant_id, const char *id, long long n)
{
    char etag[72];
    long long size = 0;
    int fd = -1;
    struct archive_output o;
    int e = archive_output_get(api_db(r), tenant_id, id, (int)n, &o);
    if (e < 0) {
        reply_job_error(r, e);
        return;
    }
    const char *ct = o.content_type ? o.content_type : "application/octet-stream";
    snprintf(etag, sizeof(etag), "\"%s\"", o.sha256 ? o.sha256 : "");
    if (!o.exists || strcmp(o.state, "archived") != 0) {
        reply_not_archived(r, &o, n);
    } else if (etag_matches(hs_req_header(r, "If-None-Match"), etag)) {
        const char *h[16];
        object_headers(ct, etag, NULL, h);
        hs_respond(r, 304, NULL, "", 0, h);
    } else if (archread_open(r, id, (int)n, &o, &fd, &size) == 0) { /* else answered */
        send_object(r, ct, etag, fd, size);
    }
    archive_output_fini(&o);
}

void outputs_get(struct hs_req *r, const struct api_args *a)
{
    char id[CRYPTO_JOB_ID_LEN + 8], token[CRYPTO_SHA256_HEX];
    long long n = -1;
    if (output_ref(r, a, id, sizeof(id), &n) < 0)
        return;
    struct tenant t;
    if (reply_caller_tenant(r, token, &t) < 0)
        return;
    serve(r, t.id, id, n);
}

void outputs_get_any(struct hs_req *r, const struct api_args *a)
{
    char id[CRYPTO_JOB_ID_LEN + 8], name[80];
    long long n = -1, tenant_id = 0;
    if (output_ref(r, a, id, sizeof(id), &n) < 0)
        return;
    int e = store_admin_tenant_of(api_db(r), id, &tenant_id, name, sizeof(name), NULL);
    if (e == STORE_ENOTFOUND)
        reply_problem(r, 404, "job-not-found", "Job not found", "no job with this id", 0);
    else if (e < 0)
        reply_store_error(r, e);
    else
        serve(r, tenant_id, id, n);
}
