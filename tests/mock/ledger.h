/*
 * idemgate-mock: the append-only ledger of received creates, and the tasks they made.
 *
 * The ledger is the evidence the integration tests use to prove that the gateway never
 * creates a paid task twice: every create request is recorded as soon as its body has been
 * read, before any delay or fault, so a create counts even when the client never sees an
 * answer.  It is process-wide and guarded by its own mutex.
 *
 * The ledger is also the provider's task store.  A create that made a task has the task's
 * result attached to its entry, and the task is named after the entry: "task_<seq>".  So
 * tasks share the ledger's cap, and /_reset forgets both at once.  A task of an asynchronous
 * personality keeps its provider's id in the entry (its state lives in async.h).  A seeded
 * task (POST /_tasks/seed) is an entry without a sequence number: it has its place among the
 * tasks, but GET /_ledger does not list it.
 */
#ifndef IDEMGATE_MOCK_LEDGER_H
#define IDEMGATE_MOCK_LEDGER_H

#include <stdbool.h>
#include <stddef.h>

/* Most entries the ledger holds; creates beyond it are refused with 507. */
#define LEDGER_MAX_ENTRIES 1000000UL

/* Marks a ledger status as "no status was or will be sent". */
#define LEDGER_NO_STATUS (-1)

/* What one received create looked like and what the mock decided to do with it. */
struct ledger_record {
    const char *route;             /* the create's path (query string excluded); copied */
    const char *provider;          /* static name of the personality that served it */
    const char *idempotency_key;   /* Idempotency-Key header or NULL; copied */
    const char *client_ref;        /* the client reference or NULL; copied */
    const char *client_ref_source; /* static name of where client_ref came from, or NULL */
    char body_sha256[65];          /* lower-case hex of the raw body */
    const char *content_type;      /* the Content-Type header or NULL; copied */
    unsigned int remote_port;      /* the client's TCP source port, 0 when unknown */
    const char *fault;             /* static fault name or NULL */
    int status;                    /* decided HTTP status or LEDGER_NO_STATUS */
    bool replay;                   /* true when the request did not start a new task */
    bool has_auth;                 /* the create carried an Authorization header */
    char auth_sha256[65];          /* lower-case hex of that header's value, when has_auth */
    const char *behavior;          /* static name of the random mode's draw, or NULL */
};

/* Bytes a task id ("task_<seq>") needs, including the terminating NUL. */
#define LEDGER_TASK_ID_MAX 32

/* Most bytes of a task id that ledger_attach_task() takes from an asynchronous provider. */
#define LEDGER_ASYNC_ID_MAX 512

/* Names one appended entry even across resets, for ledger_attach_task(). */
struct ledger_slot {
    unsigned long seq;   /* 1-based sequence number */
    unsigned long pos;   /* 1-based position among all entries, seeded tasks included */
    unsigned long epoch; /* how many resets came before the entry */
};

/* A task as ledger_each_task() shows it; the strings stay valid only during the visit. */
struct ledger_task {
    unsigned long pos;      /* the entry's position: tasks made later have larger ones */
    const char *id;         /* "task_<seq>", or a seeded task's id */
    double created;         /* the entry's time: Unix seconds with a fractional part */
    const char *client_ref; /* NULL when the create carried none */
    const char *result;     /* the JSON body the create produced or would have produced */
};

/* Which tasks ledger_each_task() visits.  Tasks not yet visible are never visited. */
struct ledger_task_query {
    const char *provider;   /* only tasks made by this personality */
    const char *client_ref; /* only tasks with this client reference; NULL for any */
    const char *id;         /* only the task with this id; NULL for any */
    bool has_since;         /* only tasks created at or after the Unix second since */
    long long since;
    bool has_until; /* only tasks created during or before the Unix second until */
    long long until;
    unsigned long before; /* only tasks at a position below this one; 0 for any */
    size_t limit;         /* visit at most this many */
};

/* Writes the id of the task that the entry numbered seq made into id (LEDGER_TASK_ID_MAX). */
void ledger_task_id(unsigned long seq, char *id);

/*
 * Appends a copy of rec with the next sequence number (1-based, restarting after a reset)
 * and the current wall-clock time.  Stores the entry's name in *slot.  Returns false when
 * the ledger is full or memory ran out; nothing is recorded then.
 */
bool ledger_append(const struct ledger_record *rec, struct ledger_slot *slot);

/*
 * Marks the entry named by slot as having made a task whose result is the JSON text
 * result (copied).  task_id is the provider's id of the task (copied), or NULL for the
 * ledger's own "task_<seq>".  The task stays out of lookups and lists until
 * visible_after_ms after the entry was recorded.  Returns false when memory ran out or a
 * reset forgot the entry.
 */
bool ledger_attach_task(const struct ledger_slot *slot, const char *task_id, const char *result,
                        unsigned int visible_after_ms);

/*
 * Adds a task that no create made (POST /_tasks/seed): it has a position, so lookups and
 * lists show it, but no sequence number, and GET /_ledger leaves it out.  The strings are
 * copied.  Returns false when the ledger is full or memory ran out.
 */
bool ledger_seed_task(const char *provider, const char *task_id, const char *client_ref,
                      const char *result);

/* Returns how many resets there have been, so a list cursor can tell it is stale. */
unsigned long ledger_epoch(void);

/*
 * Calls visit for each task that q selects, newest first, with the ledger locked: visit
 * must not call back into the ledger.  Stops after q->limit tasks or when visit returns
 * false.  Returns false when a visit did.  When more is not NULL, *more tells whether the
 * limit left out another task that q selects.
 */
bool ledger_each_task(const struct ledger_task_query *q,
                      bool (*visit)(const struct ledger_task *t, void *ctx), void *ctx, bool *more);

/*
 * Renders the ledger as {"creates": [...], "count": N}.  Returns a heap string the caller
 * frees, or NULL when memory ran out.
 */
char *ledger_to_json(void);

/* Forgets every entry and every task, and restarts the sequence at 1. */
void ledger_reset(void);

/* Frees all ledger memory at exit; no other ledger call may run concurrently. */
void ledger_shutdown(void);

#endif
