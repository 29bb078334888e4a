#ifndef IDEMGATE_OUTPUTS_H
#define IDEMGATE_OUTPUTS_H

#include "idemgate/api.h"

/* GET /v1/jobs/{id}/outputs/{n}: the archived bytes of one output of the caller's job, streamed
 * from the archive (ETag = its SHA-256, Range for video); 404 with a problem+json until the
 * output is archived. The provider's Content-Type is sent as stored but never trusted: every
 * answer carries X-Content-Type-Options: nosniff and Content-Security-Policy: sandbox, and a type
 * outside out_inline_type's allow-list Content-Disposition: attachment. Runs on a database
 * worker (routes.c offloads it). */
void outputs_get(struct hs_req *r, const struct api_args *a);
/* The same output of any tenant's job, answered the same way, for the operator (the caller has
 * proven the admin token: admin.c's GET /v1/admin/jobs/{id}/outputs/{n}). */
void outputs_get_any(struct hs_req *r, const struct api_args *a);

/* A Range request header (RFC 9110 §14) against a representation of size bytes. */
enum {
    OUT_RANGE_NONE = 0,          /* no usable range: the whole representation, 200 */
    OUT_RANGE_PARTIAL = 1,       /* one satisfiable range [*first, *last]: 206 */
    OUT_RANGE_UNSATISFIABLE = 2, /* 416 with Content-Range: bytes * /size */
};
/* Pure. Only one "bytes=" range is served; several ranges, another unit or a malformed value
 * answer the whole (as the RFC allows). *first and *last are set for NONE (0, size - 1) and
 * PARTIAL. */
int out_range(const char *hdr, long long size, long long *first, long long *last);

/* Pure. 1 when content_type (parameters ignored, case-insensitive) may be shown inline on the
 * console's origin: raster images (png, jpeg, gif, webp, avif), video (mp4, webm, ogg) and audio
 * (mpeg, mp4, ogg, wav, webm, flac, aac). SVG, HTML, NULL and anything else: 0 (a download). */
int out_inline_type(const char *content_type);

#endif
