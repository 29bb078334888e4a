#ifndef IDEMGATE_ARCHREAD_H
#define IDEMGATE_ARCHREAD_H

#include "idemgate/archive.h"
#include "idemgate/http_server.h"

/* Opening an archived output's bytes for GET /v1/jobs/{id}/outputs/{n} on whichever replica the
 * request reached (issue 21 item 13). When this replica's store cannot give the object, the
 * answer says why instead of a 500, and the refusal is logged (archive_read_unserved) and
 * counted (idemgate_archive_reads_unserved_total{reason}):
 * Every 503 carries Retry-After (30 s for an object elsewhere, 5 s for an unavailable store).
 *   503 output-in-other-replica  another replica published it (its instance_id is in the
 *                                detail) and this replica's store does not have it: with a local
 *                                archive folder per replica, the object is in that replica's
 *                                folder. Deploy a shared store (s3, or one volume for all).
 *   503 output-in-other-store    it was published to a store of another kind (local vs s3) than
 *                                this replica's.
 *   503 archive-unavailable      this replica's store could not be read (Retry-After).
 *   503 archive-busy             archive_s3_reads_max outputs were being read from the bucket
 *                                by this replica (Retry-After).
 *   500 internal                 this replica published it and its own store lost it. */

enum archread_verdict {
    ARCHREAD_OTHER_REPLICA = 0,
    ARCHREAD_OTHER_STORE,
    ARCHREAD_UNAVAILABLE,
    ARCHREAD_LOST,
};

/* Why an object could not be opened (rc: BLOB_ENOENT, BLOB_EUNAVAIL or -1, blobstore.h), given
 * where the output's row says it was published (backend, stored_by: NULL when unknown) and this
 * replica's backend and instance id. Pure. */
enum archread_verdict archread_classify(int rc, const char *backend, const char *stored_by,
                                        const char *my_backend, const char *my_instance);

/* How many bucket reads may run at once: reads_max (archive_s3_reads_max), at most db_workers - 1
 * (one worker is always left for the rest), at least 1. Pure. */
int archread_s3_room(int reads_max, int db_workers);

/* Opens output n of job_id (o: its archived row) from this replica's store: 0 with *fd (the
 * caller owns it) and *size, or -1 once it has answered the problem. On a database worker (an s3
 * object is fetched first). */
int archread_open(struct hs_req *r, const char *job_id, int n, const struct archive_output *o,
                  int *fd, long long *size);

#endif
