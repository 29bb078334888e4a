#ifndef IDEMGATE_UPLSTORE_H
#define IDEMGATE_UPLSTORE_H

#include "idemgate/config.h"
#include "idemgate/multipart.h"

#include <stddef.h>

/* Upload parts in the archive store (issue 25 §4), the I/O around upload.h: at intake the large
 * parts are published to the store (blobstore.h: fsynced, then named by their SHA-256) before
 * the intent that refers to them is committed; at each send the client's body is rebuilt from
 * the row and the objects, byte for byte. Both block (disk, or the bucket): never on a server
 * thread. */

/* Publishes the parts of body (parts, as mp_parse read them) longer than
 * cfg->upload_part_inline_bytes to the archive store, then makes the row's stored form
 * (upload.h) into *out (malloc'ed). Returns 0 with *out set; 1 when no part goes to the store
 * (*out NULL: the body is stored as it is); -1 with why when the store did not take a part (the
 * caller keeps the body whole in the row; an object published before the failure stays,
 * harmless: content-addressed, and unreferenced). *published counts the parts newly written
 * (the others were there already: the same bytes from an earlier request). */
int ups_stage(const struct cfg *cfg, const char *body, size_t len, const struct mp_part *parts,
              size_t n, char **out, size_t *outlen, int *published, char *why, size_t whylen);

/* The client's body of a stored body: when stored[0..len) is a stored form, the objects it
 * names are read from the archive store (each checked against its size and SHA-256) and the
 * client's bytes are built into *out (malloc'ed). Returns 0 with *out set; 1 when stored is not
 * a stored form (nothing done, *out NULL); -1 when it is one but malformed; UPL_UNAVAILABLE or
 * UPL_MISSING (upload.h) with why (no body bytes in it) when an object could not be read. */
int ups_expand(const struct cfg *cfg, const char *stored, size_t len, char **out, size_t *outlen,
               char *why, size_t whylen);

#endif
