#ifndef IDEMGATE_LEASE_H
#define IDEMGATE_LEASE_H

#include "idemgate/db.h"
#include "idemgate/profile.h"
#include "idemgate/states.h"

#include <stddef.h>

struct store_intake_req;
struct store_job;

/* Leases and fencing: the claims that hand an operation to one worker under a new fencing token
 * (lease_version), the writes of a worker's result under that token, and the reaper's turn of
 * expired `sending` leases into `unknown`. This is the only code through which workers change an
 * operation's state; each statement declares the moves it makes (see db.h), and a move not
 * declared is refused before it reaches the database. */

struct up_response;

/* An operation claimed for dispatch. Strings point into `res`; store_claim_fini frees. */
struct store_claim {
    void *res;
    char *own; /* the strings of a claim built in memory (lease_claim_born) */
    long long tenant_id;
    const char *id;
    long long lease_version;
    const char *provider;
    const char *route;
    const char *method;
    const char *url;
    const char *credential;
    unsigned char *body; /* owned */
    size_t body_len;
    double lease_remaining_s; /* database time left on the lease when the claim committed */
    const char *idem_header;  /* NULL: the provider has no idempotency key */
    const char *reconcile_strategy;
    enum cfg_reconcile strategy; /* reconcile_strategy, parsed once when the claim is read */
    int transport_attempts;     /* including this claim's, for a dispatch */
    long long since_first_ms;   /* since the first send */
    int outputs_requested;      /* -1 when not known */
    const char *remote_id;      /* the provider's task id, once accepted */
    const char *poll_url;       /* as the provider gave it, or NULL */
    int polls;                  /* status reads so far, this one included (poll claims) */
    int cancel_due;             /* a cancel was requested and this claim must send it */
    int poll_overdue;           /* a poll claim past the job's poll deadline (and past following
                                 * a cancel): a read that does not end the task sends it to review */
    int cancel_acknowledged;    /* a poll claim: an earlier poll's cancel was answered 2xx */
    double first_sent_db, now_db; /* Unix seconds by the database's clock, not this host's */
    int from_unknown;           /* a resend after an ambiguous attempt (set by the caller) */
    int body_rebuilt;           /* body is the client's, rebuilt from its upload (the caller) */
    int ambiguous_before;       /* some attempt was ambiguous: never `failed` by budget */
    long long since_ambiguous_ms; /* since the last ambiguous send (or the first send) */
    int cancel_requested;       /* the client cancelled: nobody sends the create again */
    const char *webhook_hint;   /* a task id a verified webhook named by client reference, or
                                 * an operator's `resolve found` of a synchronous task */
    const char *profile_stamp;  /* the profile's stamp at the intake (profile.h), or NULL */
    const char *currency;       /* the job's currency at its intake, or NULL (unpriced) */
    int operator_found;         /* the hint is an operator's word: no client reference needed */
    int operator_absent;        /* an operator resolved it `absent` and no attempt since was
                                 * ambiguous: sent again on that word */
    int born;                   /* a born reservation, still `prepared`: lease_begin_send first */
};
void store_claim_fini(struct store_claim *c);

/* The claim of a row recorded born reserved (store_intake with q->claim_owner, j its job, still
 * `prepared` under this replica's lease and fencing token 1), built from the intent and the
 * recorded row without another round trip; it owns copies of everything. c->born is set: the
 * claim must pass lease_begin_send before anything is sent. 0, or -1 when out of memory. */
/* 1 when intake recorded j born reserved for this replica (q asked for it, and got it). */
int lease_is_born(const struct store_intake_req *q, const struct store_job *j);
__attribute__((warn_unused_result)) int lease_claim_born(const struct store_intake_req *q,
                                                         const struct store_job *j,
                                                         struct store_claim *c);

/* Claims the most overdue unknown operation for reconciliation among the providers named
 * (providers: a text[] literal): a new lease and fencing token, the state stays unknown.
 * STORE_ENOTFOUND when nothing is due. */
__attribute__((warn_unused_result)) int store_reconcile_claim(struct db *db, const char *owner,
                                                              int lease_seconds,
                                                              const char *providers,
                                                              struct store_claim *out);
/* unknown → sending under the reconciler's lease (a transport retry under the same provider
 * key), sent under the profile stamped `stamp` (profile.h); updates c->lease_remaining_s and
 * c->transport_attempts. STORE_ENOTFOUND when fenced. */
__attribute__((warn_unused_result)) int store_reconcile_send(struct db *db, struct store_claim *c,
                                                             int lease_seconds,
                                                             const char *stamp);

/* Claims an accepted operation of one of the PostgreSQL text[] literal's providers due for a
 * status read (or a cancel). STORE_ENOTFOUND when none. */
__attribute__((warn_unused_result)) int store_poll_claim(struct db *db, const char *owner,
                                                         int lease_seconds, const char *providers,
                                                         struct store_claim *out);

/* Marks the cancel of a claimed poll sent (its answer was final, or it cannot be sent): the next
 * claims do not send it again; acknowledged: the provider answered it 2xx (kept, for a later
 * poll's read of a task the cancel deleted). Fenced by the claim. */
__attribute__((warn_unused_result)) int store_poll_cancel_sent(struct db *db,
                                                               const struct store_claim *c,
                                                               int acknowledged);

/* Claims the most overdue prepared operation (FOR UPDATE SKIP LOCKED): state sending, a new
 * lease_version (the fencing token) and a lease of lease_seconds of database time. Committed on
 * return, before any byte goes to the provider. Only operations of the providers in the
 * PostgreSQL text[] literal `providers` are claimed: those this replica can send to and whose
 * calls in flight are not at their limit here. The row keeps the stamp of the profile it is sent
 * under, from `stamps` (a JSON object: provider name → profile stamp, profile.h; NULL: none).
 * STORE_ENOTFOUND when nothing is due. */
__attribute__((warn_unused_result)) int store_claim(struct db *db, const char *owner,
                                                    int lease_seconds, const char *providers,
                                                    const char *stamps, struct store_claim *out);

/* lease_begin_send for n born reservations in one transaction (one round trip, one commit):
 * begun[i] is 1 when cs[i] is now `sending` (its lease, attempts and times updated, born
 * cleared), 0 when it must not be sent (as STORE_ENOTFOUND above). STORE_ERETRY when a statement
 * failed (nothing committed: run them one by one); STORE_EUNAVAIL when the connection was lost
 * (the batch may have committed); begun[] is then unset. */
__attribute__((warn_unused_result)) int lease_begin_send_many(struct db *db,
                                                              struct store_claim *const *cs,
                                                              size_t n, int lease_seconds,
                                                              int *begun);

/* A born reservation becomes a send, right before it: prepared → sending under the same fencing
 * token with a fresh lease of lease_seconds, committed before any byte leaves; updates c's lease,
 * attempts and database times and clears c->born. STORE_ENOTFOUND when it must not be sent: the
 * reservation was taken by another replica, a cancel was acknowledged (the row is failed), or the
 * provider's credential is tripped (lease_release_reservation gives the row back). */
__attribute__((warn_unused_result)) int lease_begin_send(struct db *db, struct store_claim *c,
                                                         int lease_seconds);
/* A create in flight keeps its lease: the row's lease is made to end lease_seconds from now
 * while it is still this call's (`sending`, lease_version, the lease not over). *kept says
 * whether it was; STORE_OK or an error (the lease then ends as it was). */
__attribute__((warn_unused_result)) int lease_renew_send(struct db *db, long long tenant_id,
                                                         const char *id, long long lease_version,
                                                         int lease_seconds, int *kept);
/* Gives a reservation that is not sent back to every replica: prepared, unowned, due in delay_ms.
 * *released says whether it was still ours; *tripped whether the provider's credential is. */
__attribute__((warn_unused_result)) int lease_release_reservation(struct db *db,
                                                                  const struct store_claim *c,
                                                                  long delay_ms, int *released,
                                                                  int *tripped);

/* A result's born archive claims (archive.h): room its replica's archive holds for the outputs
 * the write inserts claimed, and what the write answered. */
struct archive_born {
    int taken;      /* outputs the archive holds room for */
    double mono;    /* clock_mono() before the write: the born leases are no older */
    char *inserted; /* the write's answer: the outputs it inserted born ("0,2"), or NULL */
};

/* The result of one outbound call, written only if the claim still holds. */
struct store_finish {
    long long tenant_id;
    const char *id;
    const char *provider;
    long long lease_version;
    double lease_remaining_s; /* the claim's lease left when it was granted (the write's window) */
    enum op_state from;   /* the state the claim holds: sending, or unknown for a reconcile */
    const char *kind;     /* 'create', 'reconcile' or 'poll' */
    enum op_state state;  /* the state to write */
    const char *outcome;  /* classifier outcome name */
    int http_status;      /* 0: none */
    int curl_code;
    long bytes_sent;
    const char *resp_headers; /* JSON object text or NULL */
    const char *resp_body;
    size_t resp_body_len;
    const char *remote_id; /* or NULL */
    const char *error;     /* or NULL */
    long retry_delay_ms;   /* next_attempt_at = now() + this (prepared: retry; unknown: look) */
    int outputs_received;  /* -1: unchanged */
    int outputs_requested; /* -1: unchanged */
    const char *usage;     /* JSON text or NULL */
    const char *poll_url;  /* or NULL: unchanged */
    long long poll_deadline_ms; /* > 0: the poll deadline, this long from now (then review) */
    const char *provider_status; /* canonical task status, or NULL */
    const char *outputs_json;    /* [{"url":…,"expires_at":…}] or NULL */
    int ambiguous;               /* the attempt may have made the task: set ambiguous_at */
    long long cost_micros;       /* completed: the settled cost (pricing.h); -1: none computed,
                                  * the reservation stands (migrations/0008) */
    double started_at, finished_at; /* Unix seconds, from this host's clock */
    const char *archive_plan; /* completed with resp_body: its outputs' archive plan (archive.h's
                               * archive_plan_json), or NULL: the archive planner plans it */
    /* The plan's born claims (archive.h), or NULL: the write sets born->inserted to the outputs
     * it inserted under this replica's lease, when it says (one statement on PostgreSQL). */
    struct archive_born *born;
    /* Or NULL: the write sets *written to the state it wrote (an enum op_state: not always
     * `state` — a create's refusal on a row a signed webhook hinted is written unknown), -1
     * when it wrote nothing. */
    int *written;
};

/* Fills f for a result of claim c: its identity and fencing token, `kind` and the state the
 * claim holds (`from`), nothing received or requested (-1), and both timestamps now. The caller
 * then sets what differs: state, outcome, evidence, result. */
void store_finish_init(struct store_finish *f, const struct store_claim *c, const char *kind,
                       enum op_state from);
/* Copies a call's evidence (status, curl code, bytes sent) into f; with keep_result also its
 * headers and body as the operation's stored result. res may be NULL (no call was made). */
void store_finish_evidence(struct store_finish *f, const struct up_response *res,
                           int keep_result);

/* Writes the outcome with `WHERE lease_version = $ AND state = f->from` and records the attempt
 * in the same statement. The move f->from → f->state must be one the statement declares (and so
 * one states.c allows): otherwise STORE_EINTERNAL and nothing is written. *applied is 0 when the
 * claim was lost (fenced): the attempt is then recorded with decision 'fenced' and the operation
 * is unchanged. Once applied, the state written is passed to wake_state (wake.h): prepared wakes
 * the dispatchers, completed and failed the job's waiting clients, in every replica. */
/* The process stops: from now a batch of results whose database is out of reach gives up its
 * other rows at once once one row gave up (store_finish_many), instead of each row's window in
 * turn holding the stop. */
void store_finish_stopping(void);

/* store_finish for n results in one transaction (one round trip, one WAL flush), each fenced
 * as alone. When the batch cannot commit as one (a statement failed, the connection was lost)
 * every result is written alone, a lost connection's possible commit recognised. applied[i] and
 * errors[i] (STORE_OK or a store error) say what became of fs[i]. Returns STORE_OK. */
int store_finish_many(struct db *db, const struct store_finish *const *fs, size_t n, int *applied,
                      int *errors);
/* The order store_finish_many writes fs in: ord[] (n indexes into fs) by tenant, then job id —
 * the order an intake batch locks its tenants' budget rows in (recorder.c). On a distributed
 * database a batch is one transaction of single writes, each budgeted result locking its
 * tenant's budget row: two batches holding two tenants' rows in other orders would deadlock.
 * Pure. */
void store_finish_order(const struct store_finish *const *fs, size_t n, size_t *ord);
__attribute__((warn_unused_result)) int store_finish(struct db *db, const struct store_finish *f,
                                                     int *applied);

/* Keeps on a `sending` row, under its lease, the id its provider's stream named while the call
 * is still in flight. Returns the store error, or STORE_OK (written or not). */
/* Keeps len bytes of a stream that is still arriving on a `sending` row under its lease: at
 * offset 0 they replace the row's answer, after that they are appended where the row holds exactly
 * `offset` bytes. *kept says whether they were. Returns the store error, or STORE_OK. */
int store_note_partial(struct db *db, long long tenant_id, const char *id,
                       long long lease_version, const char *bytes, size_t len, long long offset,
                       int *kept);
/* The stored answer of claim c's operation (a cut stream's record), under c's fencing token:
 * STORE_OK with *body (malloc'ed, *len bytes), STORE_ENOTFOUND when there is none or the claim
 * was lost, or the store error. */
int store_partial_record(struct db *db, const struct store_claim *c, char **body, size_t *len);
int store_note_remote(struct db *db, long long tenant_id, const char *id, long long lease_version,
                      const char *remote_id);
/* Puts a webhook's hint back on claim c's operation after the verdict's write cleared it (its
 * task could not be read, for a reason that says nothing of the task), under c's token. */
int store_keep_hint(struct db *db, const struct store_claim *c, const char *hint);

/* Turns up to `limit` operations whose sending lease expired into unknown; *count of them. */
__attribute__((warn_unused_result)) int store_reap(struct db *db, int limit, int *count);


/* The statements of this module, for the test that holds them to the state machine. */
const struct db_stmt *const *lease_statements(size_t *n);

#endif
