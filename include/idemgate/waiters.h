#ifndef IDEMGATE_WAITERS_H
#define IDEMGATE_WAITERS_H

#include "idemgate/config.h"

/* Clients holding a connection open with `Prefer: wait=N`. Each waits, suspended (no server
 * thread is blocked), for its job to become terminal or for its deadline. A job finished in this
 * replica wakes its waiters at once (waiters_job_done, through wake.h); one thread LISTENs for
 * the `idemgate_done` signals of the other replicas (job ids joined by commas) and, as a safety
 * net for a signal that was lost, reads the state of every waiting job each wait_poll_ms in one
 * query. */

struct waiters;

/* Starts the LISTEN thread. Returns NULL when it cannot. */
__attribute__((warn_unused_result)) struct waiters *waiters_start(const struct cfg *cfg);
/* The first step of a shutdown: from now on waiters_add refuses (-1), every remaining waiter is
 * woken (its client gets the job's current state) and the LISTEN thread is stopped. The
 * structure stays valid, so a request that arrives later on a kept-alive connection is simply
 * answered at once. Calling it again does nothing; w may be NULL. */
void waiters_close(struct waiters *w);
/* Frees the waiters, closing them first if needed. Call it only when no thread can reach them
 * any more, i.e. after hs_stop (a server thread may call waiters_add until then). */
void waiters_free(struct waiters *w);

/* Registers a waiter for job_id until deadline (CLOCK_MONOTONIC seconds). wake(arg) is called
 * exactly once, from the waiters thread (or from waiters_close), when the job is terminal, the
 * deadline passes or the gateway stops. Returns 0, or -1 when it cannot wait: closed, full or out
 * of memory (wake is then never called and the caller answers at once). */
__attribute__((warn_unused_result)) int waiters_add(struct waiters *w, const char *job_id,
                                                    double deadline, void (*wake)(void *arg),
                                                    void *arg);

/* waiters_add for a job this process is working on (born claimed and handed to its own
 * dispatcher): its end is signalled in process, so the job is not read at registration; a job
 * that already finished here wakes the waiter at once, from the calling thread. */
__attribute__((warn_unused_result)) int waiters_add_local(struct waiters *w, const char *job_id,
                                                          double deadline,
                                                          void (*wake)(void *arg), void *arg);

/* gone(arg) says whether a waiter's client has left (the waiter's arg, as given to
 * waiters_add); such a waiter is woken within a fraction of a second instead of at its
 * deadline. Set once, before waiters are added. */
void waiters_on_gone(struct waiters *w, int (*gone)(void *arg));

/* Job job_id is terminal (committed): wakes its waiters now. The argument order is wake.h's
 * receiver's, w being the struct waiters. Safe from any thread until waiters_free. */
void waiters_job_done(const char *job_id, void *w);

/* Seconds of CLOCK_MONOTONIC. */
double waiters_now(void);

#endif
