/*
 * idemgate-mock: the append-only ledger of received creates.
 *
 * The ledger is the evidence the integration tests use to prove that the gateway never
 * creates a paid task twice: every create request is recorded as soon as its body has been
 * read, before any delay or fault, so a create counts even when the client never sees an
 * answer.  It is process-wide and guarded by its own mutex.
 */
#ifndef IDEMGATE_MOCK_LEDGER_H
#define IDEMGATE_MOCK_LEDGER_H

#include <stdbool.h>

/* Most entries the ledger holds; creates beyond it are refused with 507. */
#define LEDGER_MAX_ENTRIES 1000000UL

/* Marks a ledger status as "no status was or will be sent". */
#define LEDGER_NO_STATUS (-1)

/* What one received create looked like and what the mock decided to do with it. */
struct ledger_record {
    const char *route;           /* static string, the create path */
    const char *idempotency_key; /* Idempotency-Key header or NULL; copied */
    const char *client_ref;      /* X-Idemgate-Operation header or NULL; copied */
    char body_sha256[65];        /* lower-case hex of the raw body */
    unsigned int remote_port;    /* the client's TCP source port, 0 when unknown */
    const char *fault;           /* static fault name or NULL */
    int status;                  /* decided HTTP status or LEDGER_NO_STATUS */
    bool replay;                 /* true when the request did not start a new task */
};

/*
 * Appends a copy of rec with the next sequence number (1-based, restarting after a reset)
 * and the current wall-clock time.  Stores the sequence number in *seq.  Returns false
 * when the ledger is full or memory ran out; nothing is recorded then.
 */
bool ledger_append(const struct ledger_record *rec, unsigned long *seq);

/*
 * Renders the ledger as {"creates": [...], "count": N}.  Returns a heap string the caller
 * frees, or NULL when memory ran out.
 */
char *ledger_to_json(void);

/* Forgets every entry and restarts the sequence at 1. */
void ledger_reset(void);

/* Frees all ledger memory at exit; no other ledger call may run concurrently. */
void ledger_shutdown(void);

#endif
