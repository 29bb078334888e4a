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

/* 1 when an If-None-Match value names etag (or is "*"). */
static int etag_matches(const char *inm, const char *etag)
{
    return inm && (strcmp(inm, "*") == 0 || strstr(inm, etag) != NULL);
}

void outputs_get(struct hs_req *r, const struct api_args *a)
{
    char id[CRYPTO_JOB_ID_LEN + 8], nbuf[16], token[CRYPTO_SHA256_HEX];
    long long n = -1;
    if (api_arg(a, 0, id, sizeof(id)) <= 0 || api_arg(a, 1, nbuf, sizeof(nbuf)) <= 0 ||
        parse_pos(nbuf, strlen(nbuf), &n) < 0 || n > 100000) {
        reply_problem(r, 404, "job-not-found", "Job not found", "no job with this id", 0);
        return;
    }
    if (reply_token_hash(r, token) < 0) {
        reply_unauthorized(r);
        return;
    }
    struct archive_output o;
    int e = archive_output_get(api_db(r), token, id, (int)n, &o);
    if (e < 0) {
        reply_job_error(r, e);
        return;
    }
    if (!o.exists || strcmp(o.state, "archived") != 0) {
        char detail[600];
        if (!o.exists)
            snprintf(detail, sizeof(detail),
                     o.planned ? "this job has no output %lld"
                               : "output %lld is not archived yet: the "
                                 "job's outputs are not planned",
                     n);
        else
            snprintf(detail, sizeof(detail),
                     "output %lld is not archived: archive state %s%s%.400s", n, o.state,
                     o.last_error ? ", last error: " : "", o.last_error ? o.last_error : "");
        reply_problem(r, 404, o.exists || !o.planned ? "output-not-archived" : "output-not-found",
                      o.exists || !o.planned ? "Output not archived" : "Output not found", detail,
                      0);
        archive_output_fini(&o);
        return;
    }
    char etag[72];
    snprintf(etag, sizeof(etag), "\"%s\"", o.sha256);
    const char *ct = o.content_type ? o.content_type : "application/octet-stream";
    if (etag_matches(hs_req_header(r, "If-None-Match"), etag)) {
        const char *h[] = {"ETag", etag, NULL};
        hs_respond(r, 304, NULL, "", 0, h);
        archive_output_fini(&o);
        return;
    }
    int fd = -1;
    long long size = 0;
    if (archread_open(r, id, (int)n, &o, &fd, &size) < 0) { /* answered */
        archive_output_fini(&o);
        return;
    }
    long long first, last;
    /* If-Range with another validator: the whole representation (RFC 9110 §13.1.5). */
    const char *ifr = hs_req_header(r, "If-Range");
    int rr = ifr && strcmp(ifr, etag) != 0
                 ? OUT_RANGE_NONE
                 : out_range(hs_req_header(r, "Range"), size, &first, &last);
    char cr[96];
    if (rr == OUT_RANGE_UNSATISFIABLE) {
        close(fd);
        char detail[96];
        snprintf(detail, sizeof(detail), "the output is %lld bytes long", size);
        reply_problem(r, 416, "range-not-satisfiable", "Range not satisfiable", detail, 0);
    } else if (rr == OUT_RANGE_PARTIAL) {
        snprintf(cr, sizeof(cr), "bytes %lld-%lld/%lld", first, last, size);
        const char *h[] = {"Content-Range", cr, "ETag", etag, "Accept-Ranges", "bytes", NULL};
        hs_respond_fd(r, 206, ct, fd, (unsigned long long)first,
                      (unsigned long long)(last - first + 1), h);
    } else {
        const char *h[] = {"ETag", etag, "Accept-Ranges", "bytes", NULL};
        hs_respond_fd(r, 200, ct, fd, 0, (unsigned long long)size, h);
    }
    archive_output_fini(&o);
}
