#ifndef IDEMGATE_BLOBSTORE_H
#define IDEMGATE_BLOBSTORE_H

#include "idemgate/config.h"

#include <stddef.h>

/* The archive's object store, content-addressed by SHA-256 (issue 13 §1). A copy is written to a
 * temporary file in archive_dir/tmp (hashed as it is written), fsynced, and only then published
 * under its hash: renamed into archive_dir/objects/ab/abcd… and the folder fsynced (local), or
 * PUT to the bucket with its SHA-256 declared so the server checks it (s3, SigV4 signed by
 * libcurl). The same bytes twice is a no-op; a process killed mid-copy leaves only a temporary
 * file, which blob_sweep removes, never a partial object. Nothing is created before the first
 * copy or the first readiness probe (blob_probe; a replica that archives nothing probes nothing
 * and writes nothing). Safe from several threads. */

struct blob_store;

/* The backend cfg names; the secrets are read from the environment at each call. NULL when out
 * of memory. */
struct blob_store *blob_open(const struct cfg *cfg);
void blob_close(struct blob_store *b);
const char *blob_backend(const struct blob_store *b);

/* A copy in progress. */
struct blob_tmp {
    int fd;
    char path[1024];
    void *md; /* EVP_MD_CTX */
    long long bytes;
};

/* Opens a new temporary file for a copy. 0, or -1 with the reason in why. */
int blob_tmp_open(struct blob_store *b, struct blob_tmp *t, char *why, size_t whylen);
/* Appends (ptr, len), hashing it. 0 or -1 (errno). */
int blob_tmp_write(struct blob_tmp *t, const void *ptr, size_t len);
/* Publishes the copy under its SHA-256 (hex into sha, 65 bytes) and removes the temporary file;
 * *existed is 1 when the object was already there (nothing was written). 0, or -1 with why. */
int blob_tmp_commit(struct blob_store *b, struct blob_tmp *t, const char *content_type,
                    char sha[65], int *existed, char *why, size_t whylen);
/* Closes and removes a copy that will not be published. */
void blob_tmp_abort(struct blob_tmp *t);

/* Removes the temporary files that processes of this host no longer running left behind (a
 * copy killed midway). */
void blob_sweep(struct blob_store *b);

/* Whose temporary file `name` (host.pid.run.seq, or an older host.pid.seq) is, seen by the
 * process mypid of run myrun on host: another host's (or no name of ours: left alone), this
 * run's own, an earlier run's with the same pid (a container's pid 1 restarted: dead), or
 * another pid's (*pid: dead when no such process lives). Pure. */
enum blob_tmp_owner {
    BLOB_TMP_OTHER_HOST,
    BLOB_TMP_OURS,
    BLOB_TMP_EARLIER_RUN,
    BLOB_TMP_OTHER_PID,
};
enum blob_tmp_owner blob_tmp_owner(const char *name, const char *host, long mypid,
                                   const char *myrun, long *pid);

/* blob_open_read's failures, beside -1 (not a SHA-256): the store answered that it has no such
 * object, or the store could not be read (folder unreadable, bucket unreachable or refusing). */
#define BLOB_ENOENT (-2)
#define BLOB_EUNAVAIL (-3)

/* Opens object sha for reading: *fd (the caller owns it) and its size. For s3 the object is
 * fetched into an unnamed temporary file first. 0, or -1, BLOB_ENOENT or BLOB_EUNAVAIL with
 * why. */
int blob_open_read(struct blob_store *b, const char *sha, int *fd, long long *size, char *why,
                   size_t whylen);

/* Whether the store can take a copy now: a small file written, fsynced and removed in the
 * spool (archive_dir/tmp), and for s3 a small object PUT and DELETEd under idemgate-probe/ (each
 * request within 5 s). 0, or -1 with why. Blocks: never on a server thread. */
int blob_probe(struct blob_store *b, char *why, size_t whylen);

#endif
