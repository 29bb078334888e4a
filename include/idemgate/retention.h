#ifndef IDEMGATE_RETENTION_H
#define IDEMGATE_RETENTION_H

/* Retention (job_ttl_hours): what the janitor deletes, and when a sweep goes on. A pure module;
 * the statements are store.c's (store_janitor, store_unreferenced_sha256) and the thread is the
 * reaper's.
 *
 * A sweep deletes, one bounded batch of each kind per statement: terminal operations past their
 * expires_at (their attempts go with them; each leaves its key's tombstone, written a sweep
 * before, which answers a retry under the key for 30 days — an operation that is not terminal
 * is never deleted, whatever its age, as its key is what keeps a second paid create away; the
 * operations' count includes the tombstones written and deleted), webhook records past their
 * redelivery window, and
 * parked hints older than a day. Archived files are the archive's to delete: it lists its
 * objects and asks store_unreferenced_sha256 which of them no remaining job references. */

enum ret_kind { RET_OPERATIONS = 0, RET_WEBHOOK_EVENTS, RET_PARKED, RET__KINDS };

/* Whether a sweep runs another batch at once: some kind filled its batch (more may be waiting)
 * and fewer than max_rounds batches ran in this sweep (round counts from 1); the rest waits for
 * the next sweep, so one sweep never holds the reaper's thread for long. */
int ret_more(const long long deleted[RET__KINDS], int batch, int round, int max_rounds);

#endif
