#ifndef IDEMGATE_ARCHIVE_H
#define IDEMGATE_ARCHIVE_H

#include "idemgate/config.h"
#include "idemgate/db.h"
#include "idemgate/lease.h"

/* Output archival (issue 13 §1): archive workers (a wpool, cfg->archive_workers threads) plan
 * the outputs of completed operations into archive_outputs rows (one statement marks the
 * operation planned and inserts its rows, so two workers never plan twice), then claim pending
 * rows (FOR UPDATE SKIP LOCKED, a lease and a fencing token) and copy each one — a URL, base64 in
 * the result, or the provider's content endpoint — into the content-addressed store
 * (blobstore.h), before the URL expires. A worker killed mid-copy leaves no object; the row's
 * lease runs out and another claim copies it again. */

struct archiver;
struct eng;
/* Starts the archive workers (none when cfg->archive_workers is 0; sweeps the spool of copies
 * that dead processes left first). The threads plan, claim, decode base64 and publish; the
 * copies from URLs run on the call engine e, counted in its max_inflight_calls. NULL only on
 * failure. */
struct archiver *archive_start(const struct cfg *cfg, struct eng *e);
/* Stops claiming; the copies in flight still end and are written (archive_stop, after
 * eng_stop). */
void archive_quiesce(struct archiver *A);
/* Writes what is left, stops the threads and frees A (A may be NULL). */
void archive_stop(struct archiver *A);

/* The lease of an archive claim, in seconds (pure): lease_seconds, or the longest of the
 * providers' archive.timeout_ms plus 5 s (the write of the copy's end) when that is longer — a fetch is cut at what its claim's lease has left. */
int archive_lease_s(const struct cfg *cfg);

/* Born claims (issue 23: a claim statement per output was ~13 % of a job's executor time). The
 * write of a result this replica's archive has room for claims its fetched outputs itself: they
 * are inserted under this replica's lease (fencing token 1, one attempt counted), and once the
 * write has committed they go straight to the archive threads, as a claim's rows would. The room
 * is taken before the write (engine slots and archive_max_inflight, as a claim takes them) and
 * given back for every output the write did not insert under that lease: fenced, an output
 * already there, a write lost with its connection (its rows, if any, wait for their lease to
 * run out, then any replica's claim takes them), a distributed database (its finish function
 * inserts every output unclaimed). A process that dies in between leaves them the same way.
 * (struct archive_born is lease.h's: the write fills it in.) */

/* Once the write of the result is known: written (committed, completed, applied) hands the
 * outputs b->inserted names to the archive threads; the rest of b's room is given back. The
 * job's identity and the plan (archive_plan_json's, whose rows the write inserted) say what each
 * output is. Leaves b empty; safe on an empty b. */
void archive_born_settle(struct archive_born *b, int written, long long tenant_id,
                         const char *job_id, const char *provider, const char *remote_id,
                         const char *plan);

/* The archive plan of a result f being written completed by provider p (its outputs, as the
 * archive planner would read them from the stored row: f's body, f's remote id or else the
 * row's remote_id, the claim's credential name), for store_finish's archive_plan: the write then
 * marks the operation planned and inserts its outputs' rows. With born (not NULL), the fetched
 * outputs this replica's archive has room for are marked to be inserted claimed by it (above).
 * NULL when f is not a completed result with its body, or out of memory: the planner plans it
 * later. Free the string. */
struct store_finish;
char *archive_plan_json(const struct cfg_provider *p, const struct store_finish *f,
                        const char *remote_id, const char *credential, struct archive_born *born);

/* Once a plan was written with its result (the write committed and applied it): says and counts
 * the outputs the plan itself ended (refused by the profile's archive policy), as a claim's
 * refusal is said and counted. */
void archive_plan_written(const char *plan, const char *job_id, const char *provider);

/* The archive of one job's outputs as a JSON array (new string in *json; "[]" until they are
 * planned); *settled: planned, and no output is still pending (the view no longer changes).
 * STORE_ codes. */
int archive_job_outputs(struct db *db, long long tenant_id, const char *job_id, char **json,
                        int *settled);

/* One output of a tenant's job, for GET /v1/jobs/{id}/outputs/{n}. */
struct archive_output {
    void *res; /* PGresult; strings point into it */
    const char *state, *sha256, *content_type, *last_error;
    const char *backend;   /* where it was published: "local" or "s3" (NULL until archived) */
    const char *stored_by; /* the instance_id of the replica that published it (NULL: unknown,
                              archived before that was recorded) */
    long long bytes;
    int planned; /* the job's outputs were planned */
    int exists;  /* the output exists (planned, with that index) */
};
/* STORE_OK or STORE_ENOTFOUND (no such job for the tenant). */
int archive_output_get(struct db *db, long long tenant_id, const char *job_id, int n,
                       struct archive_output *out);
void archive_output_fini(struct archive_output *o);

/* The archive's statements, for `idemgate statements`. */
struct db_stmt;
const struct db_stmt *const *archive_statements(size_t *n);

#endif
