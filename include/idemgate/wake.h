#ifndef IDEMGATE_WAKE_H
#define IDEMGATE_WAKE_H

#include "idemgate/config.h"
#include "idemgate/db.h"
#include "idemgate/states.h"

#include <stddef.h>

/* Wake-ups, kept out of every request's commit. Whoever commits a state that someone may be
 * waiting for says so here, after the commit: wake_work when an operation became prepared (new
 * or again), wake_done when one became completed or failed. This replica's idle dispatchers and
 * waiting clients are woken at once, in process; the other replicas learn through one signaller
 * thread that, at most every WAKE_BATCH_MS, sends everything pending as ONE transaction of
 * NOTIFYs on its own connection: one on WAKE_WORK_CHANNEL when any work appeared, and on
 * WAKE_DONE_CHANNEL payloads joining many job ids with commas. It never runs inside anyone
 * else's commit. A signal the database could not take is kept and sent later (bounded); a signal
 * lost anyway costs latency only, as dispatchers poll every poll_interval_ms and waiters re-read
 * their jobs every wait_poll_ms.
 *
 * The module is one per process, like the job cache. Before wake_start (and in processes that
 * never call it, the CLI) wake_work and wake_done only queue: wake_flush sends the queue on a
 * connection of the caller's. Every function is safe from any thread. */

#define WAKE_WORK_CHANNEL "idemgate_work"
#define WAKE_DONE_CHANNEL "idemgate_done"
/* The shortest interval between two signalling transactions (the first signal after a quiet
 * spell goes at once). */
#define WAKE_BATCH_MS 5
/* PostgreSQL refuses a NOTIFY payload of 8000 bytes or more. */
#define WAKE_PAYLOAD_MAX 7999
/* A job id longer than this (or with a character outside [A-Za-z0-9_-]) is not one of ours. */
#define WAKE_ID_MAX 63
/* Job ids kept for the other replicas while the database cannot take them; more are dropped
 * (their waiters fall back on wait_poll_ms). */
#define WAKE_QUEUE_MAX 65536

/* Starts the signaller thread (its own database connection) and the in-process work signal.
 * 0, or -1 when it cannot (nothing started). */
__attribute__((warn_unused_result)) int wake_start(const struct cfg *cfg);
/* Sends what is pending once more (best effort), stops the signaller and closes its
 * connection. Call it after every thread that may call wake_work or wake_done has stopped.
 * Calling it when not started does nothing. */
void wake_stop(void);

/* New due work exists: wakes this replica's idle dispatchers now and marks that the other
 * replicas must be told. */
void wake_work(void);
/* A count that grows on every wake_work of this process and every work signal heard from another
 * replica (wake_heard_work): a claim that read its candidates before the count moved reads them
 * again (turns.h). */
unsigned long wake_news(void);
/* A work signal came from another replica (the pools call it on their LISTEN connection). */
void wake_heard_work(void);
/* Job job_id became terminal: wakes its waiters in this replica now and queues the id for the
 * other replicas. */
void wake_done(const char *job_id);
/* After a committed write that left job_id in state st: wake_work for prepared, wake_done for
 * completed and failed, nothing for the other states. */
void wake_state(const char *job_id, enum op_state st);

/* An eventfd that becomes readable on wake_work (the dispatchers poll it while idle and read it
 * before they claim); -1 before wake_start. */
int wake_work_fd(void);
/* Registers the in-process receiver of wake_done (NULL: none). When it returns, no call to the
 * previous receiver is in progress, so that receiver may be freed. */
void wake_on_done(void (*fn)(const char *job_id, void *arg), void *arg);
/* 1 when a notification came from this replica's own signaller (its server process id is
 * sender_pid): its wake-ups were already made in process, so the listener may ignore it. */
int wake_is_echo(int sender_pid);

/* Sends what is pending now, on db (for processes without a signaller: the CLI). 0, or a store
 * error (what was pending is then kept). */
__attribute__((warn_unused_result)) int wake_flush(struct db *db);

/* Pure: the payloads of WAKE_DONE_CHANNEL for ids[0..n) as a PostgreSQL text[] literal, each
 * element the ids it holds joined by commas and at most max_payload bytes long (every id in
 * exactly one element, in order). Ids that are not job ids (see WAKE_ID_MAX) are skipped.
 * *elements gets the number of payloads. Returns a new string ("{}" when no id is kept), or NULL
 * when out of memory or max_payload is under WAKE_ID_MAX. */
char *wake_payloads(const char *const *ids, size_t n, size_t max_payload, size_t *elements);
/* Pure: calls cb for each job id in a WAKE_DONE_CHANNEL payload (ids joined by commas; a single
 * id, as older replicas sent, is one). Empty pieces and pieces that are not job ids are skipped.
 * Returns the number of ids passed to cb. */
size_t wake_split(const char *payload, void (*cb)(const char *job_id, void *arg), void *arg);

#endif
