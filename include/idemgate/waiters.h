#ifndef IDEMGATE_WAITERS_H
#define IDEMGATE_WAITERS_H

#include "idemgate/config.h"

/* Clients holding a connection open with `Prefer: wait=N`. Each waits, suspended (no server
 * thread is blocked), for its job to become terminal or for its deadline. One thread LISTENs
 * for the `idemgate_done` notifications of every replica and wakes the waiters of that job. */

struct waiters;

struct waiters *waiters_start(const struct cfg *cfg);
/* Wakes every remaining waiter (their clients get the current state) and stops the thread. */
void waiters_stop(struct waiters *w);

/* Registers a waiter for job_id until deadline (CLOCK_MONOTONIC seconds). wake(arg) is called
 * exactly once, from the waiters thread, when the job is terminal, the deadline passes or the
 * gateway stops. Returns 0, or -1 when it cannot wait (the caller answers at once). */
__attribute__((warn_unused_result)) int waiters_add(struct waiters *w, const char *job_id,
                                                    double deadline, void (*wake)(void *arg),
                                                    void *arg);

/* Seconds of CLOCK_MONOTONIC. */
double waiters_now(void);

#endif
