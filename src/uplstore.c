#include "idemgate/uplstore.h"

#include "idemgate/blobstore.h"
#include "idemgate/crypto.h"
#include "idemgate/upload.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int ups_stage(const struct cfg *cfg, const char *body, size_t len, const struct mp_part *parts,
              size_t n, char **out, size_t *outlen, int *published, char *why, size_t whylen)
{
    *out = NULL;
    *outlen = 0;
    *published = 0;
    unsigned char sel[MP_MAX_PARTS];
    if (n > MP_MAX_PARTS || !upl_select(parts, n, cfg->upload_part_inline_bytes, sel))
        return 1;
    char(*shas)[65] = calloc(n, sizeof(*shas));
    struct upl_ref *refs = calloc(n, sizeof(*refs));
    struct blob_store *b = shas && refs ? blob_open(cfg) : NULL;
    int rc = -1;
    if (!b) {
        snprintf(why, whylen, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        if (!sel[i])
            continue;
        struct blob_tmp t;
        int existed = 0;
        if (blob_tmp_open(b, &t, why, whylen) < 0)
            goto done;
        if (blob_tmp_write(&t, parts[i].data, parts[i].data_len) < 0) {
            snprintf(why, whylen, "writing a part to the archive folder: %s", strerror(errno));
            blob_tmp_abort(&t);
            goto done;
        }
        /* Durable (fsynced, renamed, folder fsynced; or PUT and acknowledged) before it returns:
         * the row that will name it is committed only afterwards. */
        if (blob_tmp_commit(b, &t, NULL, shas[i], &existed, why, whylen) < 0)
            goto done;
        *published += !existed;
    }
    size_t k = upl_refs_of(body, parts, n, sel, (const char(*)[65])shas, refs);
    if (upl_store_form(body, len, refs, k, out, outlen) < 0) {
        snprintf(why, whylen, "out of memory");
        goto done;
    }
    rc = 0;
done:
    blob_close(b);
    free(refs);
    free(shas);
    return rc;
}

/* Reads one referenced object into dst, checked against the size and SHA-256 recorded. */
struct fetch_ctx {
    struct blob_store *b;
    char *why;
    size_t whylen;
};

static int fetch_object(void *arg, const struct upl_ref *ref, char *dst)
{
    struct fetch_ctx *f = arg;
    int fd = -1;
    long long size = 0;
    int rc = blob_open_read(f->b, ref->sha256, &fd, &size, f->why, f->whylen);
    if (rc == BLOB_ENOENT)
        return UPL_MISSING;
    if (rc < 0)
        return UPL_UNAVAILABLE;
    if (size != (long long)ref->size) {
        close(fd);
        snprintf(f->why, f->whylen, "object %.12s… holds %lld bytes, the row recorded %zu",
                 ref->sha256, size, ref->size);
        return UPL_MISSING;
    }
    size_t got = 0;
    while (got < ref->size) {
        ssize_t r = pread(fd, dst + got, ref->size - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            snprintf(f->why, f->whylen, "reading object %.12s…: %s", ref->sha256,
                     r < 0 ? strerror(errno) : "shorter than its size");
            close(fd);
            return UPL_UNAVAILABLE;
        }
        got += (size_t)r;
    }
    close(fd);
    char sha[CRYPTO_SHA256_HEX];
    crypto_sha256_hex(dst, ref->size, sha);
    if (strcmp(sha, ref->sha256) != 0) {
        snprintf(f->why, f->whylen, "object %.12s… does not hold the bytes of its name (damaged)",
                 ref->sha256);
        return UPL_MISSING;
    }
    return 0;
}

int ups_expand(const struct cfg *cfg, const char *stored, size_t len, char **out, size_t *outlen,
               char *why, size_t whylen)
{
    *out = NULL;
    *outlen = 0;
    if (!upl_is_stored_form(stored, len))
        return 1;
    struct upl_ref *refs = malloc(MP_MAX_PARTS * sizeof(*refs));
    size_t n = 0, body_at = 0, total = 0;
    if (!refs) {
        snprintf(why, whylen, "out of memory");
        return UPL_UNAVAILABLE;
    }
    /* No client body is larger than the largest upload the setting's bounds allow. */
    if (upl_parse(stored, len, refs, MP_MAX_PARTS, &n, &body_at, &total, 512u << 20) < 0) {
        snprintf(why, whylen, "the stored upload's table is malformed");
        free(refs);
        return -1;
    }
    char *body = malloc(total ? total : 1);
    struct blob_store *b = body ? blob_open(cfg) : NULL;
    if (!b) {
        snprintf(why, whylen, "out of memory");
        free(body);
        free(refs);
        return UPL_UNAVAILABLE;
    }
    struct fetch_ctx f = {.b = b, .why = why, .whylen = whylen};
    int rc = upl_expand(stored, len, refs, n, body_at, body, total, fetch_object, &f);
    blob_close(b);
    free(refs);
    if (rc != 0) {
        if (rc < 0)
            snprintf(why, whylen, "the stored upload does not match its table");
        free(body);
        return rc;
    }
    *out = body;
    *outlen = total;
    return 0;
}
