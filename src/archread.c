#include "idemgate/archread.h"

#include "idemgate/api.h"
#include "idemgate/blobstore.h"
#include "idemgate/crash.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/reply.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* Retry-After: a store that did not answer may soon; an object in another replica's store may
 * be reached through another replica (a load balancer's next pick) or once the archive is
 * shared. */
#define UNAVAILABLE_RETRY_AFTER_S 5
#define ELSEWHERE_RETRY_AFTER_S 30
#define BUSY_RETRY_AFTER_S 1

/* Bucket reads in progress in this process (archive_s3_reads_max). */
static atomic_int s3_reads;

int archread_s3_room(int reads_max, int db_workers)
{
    int cap = db_workers > 1 && reads_max > db_workers - 1 ? db_workers - 1 : reads_max;
    return cap < 1 ? 1 : cap;
}

enum archread_verdict archread_classify(int rc, const char *backend, const char *stored_by,
                                        const char *my_backend, const char *my_instance)
{
    /* A row archived before the backend was recorded can only be local (the first backend). */
    if (strcmp(backend ? backend : "local", my_backend) != 0)
        return ARCHREAD_OTHER_STORE;
    if (rc == BLOB_EUNAVAIL)
        return ARCHREAD_UNAVAILABLE;
    /* Absent here: published by another replica (or by one that did not say who it was), whose
     * store this replica does not share; else this replica's own store lost it. */
    if (!stored_by || strcmp(stored_by, my_instance) != 0)
        return ARCHREAD_OTHER_REPLICA;
    return ARCHREAD_LOST;
}

/* The problem for a verdict, logged once and counted. */
static void answer(struct hs_req *r, const char *job_id, int n, const struct archive_output *o,
                   enum archread_verdict v, const char *why)
{
    const struct cfg *cfg = api_cfg(r);
    const char *by = o->stored_by ? o->stored_by : "an unrecorded replica";
    const char *backend = o->backend ? o->backend : "local";
    static const char *const names[] = {"other_replica", "other_store", "unavailable", "lost"};
    char detail[700];
    LOG(v == ARCHREAD_LOST ? LOG_ERROR : LOG_WARN, "archive_read_unserved", LS("job_id", job_id),
        LI("output", n), LS("reason", names[v]), LS("stored_by", by), LS("backend", backend),
        LS("error", why));
    if (v == ARCHREAD_OTHER_REPLICA) {
        metrics_archive_read_unserved(MAR_OTHER_REPLICA);
        snprintf(detail, sizeof(detail),
                 "output %d was archived by replica %.200s in its own %s store, which this "
                 "replica (%.200s) cannot read; multi-replica deployments need a shared archive "
                 "(archive_backend s3, or one volume mounted by every replica)",
                 n, by, backend, cfg->instance_id);
        reply_problem(r, 503, "output-in-other-replica", "Output stored by another replica", detail,
                      ELSEWHERE_RETRY_AFTER_S);
    } else if (v == ARCHREAD_OTHER_STORE) {
        metrics_archive_read_unserved(MAR_OTHER_STORE);
        snprintf(detail, sizeof(detail),
                 "output %d was archived to a %s store by replica %.200s; this replica archives "
                 "to %s: every replica needs the same archive settings",
                 n, backend, by, cfg->archive_backend);
        reply_problem(r, 503, "output-in-other-store", "Output stored in another archive", detail,
                      ELSEWHERE_RETRY_AFTER_S);
    } else if (v == ARCHREAD_UNAVAILABLE) {
        metrics_archive_read_unserved(MAR_UNAVAILABLE);
        reply_problem(r, 503, "archive-unavailable", "Archive unavailable",
                      "the archive could not be read; try again", UNAVAILABLE_RETRY_AFTER_S);
    } else {
        reply_problem(r, 500, "internal", "Internal error",
                      "the archived object is missing from this replica's archive", 0);
    }
}

int archread_open(struct hs_req *r, const char *job_id, int n, const struct archive_output *o,
                  int *fd, long long *size)
{
    char why[256] = "out of memory";
    const struct cfg *cfg = api_cfg(r);
    /* A bucket's object comes whole to a temporary file on this database worker: a few large
     * videos read at once would hold every worker, and every tenant's reads and cancels wait
     * behind them. At most archive_s3_reads_max at once (never every worker); the others are
     * told to come back. */
    int s3 = strcmp(cfg->archive_backend, "s3") == 0; /* whatever the row says: the bucket */
    int room = archread_s3_room(cfg->archive_s3_reads_max, cfg->db_workers);
    if (s3 && atomic_fetch_add(&s3_reads, 1) >= room) {
        atomic_fetch_sub(&s3_reads, 1);
        metrics_archive_read_unserved(MAR_BUSY);
        char detail[160];
        snprintf(detail, sizeof(detail),
                 "%d outputs are being read from the archive's bucket by this replica: try "
                 "again in a moment",
                 room);
        reply_problem(r, 503, "archive-busy", "Archive busy", detail, BUSY_RETRY_AFTER_S);
        return -1;
    }
    if (s3)
        CRASH_POINT("archive_s3_read");
    struct blob_store *b = blob_open(cfg);
    int rc = b ? blob_open_read(b, o->sha256, fd, size, why, sizeof(why)) : BLOB_EUNAVAIL;
    blob_close(b);
    if (s3)
        atomic_fetch_sub(&s3_reads, 1);
    if (rc == 0)
        return 0;
    answer(r, job_id, n, o,
           archread_classify(rc, o->backend, o->stored_by, cfg->archive_backend, cfg->instance_id),
           why);
    return -1;
}
