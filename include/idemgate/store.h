#ifndef IDEMGATE_STORE_H
#define IDEMGATE_STORE_H

#include "idemgate/states.h"

#include <stddef.h>
#include <stdint.h>

/* PostgreSQL, the single source of truth. Every SQL statement of the gateway lives in this file's
 * implementation, prepared once per connection. A `struct db` is one connection used by one
 * thread at a time; it reconnects by itself after a failure (the failing call reports
 * STORE_EUNAVAIL, the next call tries again). */

enum store_err {
    STORE_OK = 0,
    STORE_EUNAVAIL = -1,  /* the database cannot be reached: 503 with Retry-After */
    STORE_ERETRY = -2,    /* serialization failure or deadlock: run the statement again */
    STORE_EINTERNAL = -3, /* anything else: a bug or a broken schema */
    STORE_ENOTFOUND = -4, /* no such row (or nothing to do) */
    STORE_EAUTH = -5,     /* no live tenant has that token */
    STORE_ECONFLICT = -6, /* a unique name is taken */
};

struct db;

/* Connects to url and prepares every statement. Never fails for an unreachable database: the
 * handle is returned disconnected and each call retries the connection (so a replica started
 * before PostgreSQL comes up by itself). Returns NULL only when out of memory. */
struct db *store_db_open(const char *url);
void store_db_close(struct db *db);
/* 1 when the last call reached the database. */
int store_db_ok(struct db *db);
/* Counts the connections made so far; a change means session state (LISTEN) was lost. */
unsigned store_db_generation(struct db *db);
/* The raw libpq connection (migrate.c and tests of the store only); may be NULL. */
void *store_db_pgconn(struct db *db);
/* Makes sure the connection is up (reconnecting if it is not); 0 or STORE_EUNAVAIL. */
__attribute__((warn_unused_result)) int store_db_ensure(struct db *db);

/* A job as read from the operations table. The strings point into a result owned by the
 * struct; store_job_fini releases them. Absent values are NULL (numbers: 0). */
struct store_job {
    void *res; /* PGresult */
    long long tenant_id;
    const char *id;
    const char *idempotency_key;
    const char *fingerprint_hex;
    const char *provider;
    const char *route;
    enum op_state state;
    long long lease_version;
    int transport_attempts;
    int generation_attempts;
    const char *parent_id;
    const char *remote_id;
    int resp_status;
    const char *resp_headers; /* JSON object text */
    unsigned char *resp_body; /* decoded bytes (owned), resp_body_len long */
    size_t resp_body_len;
    const char *last_error;
    const char *created_at, *updated_at, *first_sent_at, *finished_at, *expires_at;
    int outputs_requested, outputs_received; /* -1 when not known */
    const char *usage;                        /* JSON text */
    const char *resolution, *resolved_by, *resolved_at;
    const char *reconcile_strategy;
    const char *blocked_reason; /* the provider's credential is tripped: why */
    const char *provider_status; /* canonical task status at the provider (async) */
    const char *outputs;         /* JSON array of {"url", "expires_at"} */
    const char *cancel_requested_at;
    const char *profile_id;
    int polls;
};
void store_job_fini(struct store_job *j);

struct store_intake_req {
    const char *token_sha256_hex;
    const char *idempotency_key;
    const char *new_id; /* used only when the row is new */
    const char *fingerprint_hex;
    int fingerprint_version;
    const char *provider;
    const char *route;
    const char *method;
    const char *url;
    const char *credential; /* name of the variable that holds the secret, or "" */
    const char *body;
    size_t body_len;
    int ttl_hours;
    const char *idem_header;        /* the provider's idempotency header, or NULL */
    const char *reconcile_strategy; /* see migrations/0002 */
    int outputs_requested;          /* -1 when not known */
    const char *profile_id;
};

/* The intake decision in one round trip: insert the intent (committed on return) or read the
 * row that holds the key. *created is 1 for a new row. STORE_EAUTH for a bad token. A racing
 * insert is re-read, never reported as an error. */
__attribute__((warn_unused_result)) int store_intake(struct db *db,
                                                     const struct store_intake_req *r,
                                                     struct store_job *out, int *created);

/* A tenant's job by id: STORE_EAUTH, STORE_ENOTFOUND (also another tenant's job) or STORE_OK. */
__attribute__((warn_unused_result)) int store_job_get(struct db *db, const char *token_sha256_hex,
                                                      const char *job_id, struct store_job *out);

/* An operation claimed for dispatch. Strings point into `res`; store_claim_fini frees. */
struct store_claim {
    void *res;
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
    int transport_attempts;     /* including this claim's, for a dispatch */
    long long since_first_ms;   /* since the first send */
    int outputs_requested;      /* -1 when not known */
    const char *remote_id;      /* the provider's task id, once accepted */
    const char *poll_url;       /* as the provider gave it, or NULL */
    int polls;                  /* status reads so far, this one included (poll claims) */
    int cancel_due;             /* a cancel was requested and this claim must send it */
    double first_sent_db, now_db; /* Unix seconds by the database's clock, not this host's */
    int from_unknown;           /* a resend after an ambiguous attempt (set by the caller) */
    int ambiguous_before;       /* some attempt was ambiguous: never `failed` by budget */
    long long since_ambiguous_ms; /* since the last ambiguous send (or the first send) */
    int cancel_requested;       /* the client cancelled: nobody sends the create again */
    const char *webhook_hint;   /* a task id a verified webhook named by client reference, or
                                 * an operator's `resolve found` of a synchronous task */
    int operator_found;         /* the hint is an operator's word: no client reference needed */
};
void store_claim_fini(struct store_claim *c);

/* Claims the most overdue unknown operation for reconciliation: a new lease and fencing token,
 * the state stays unknown. STORE_ENOTFOUND when nothing is due. */
__attribute__((warn_unused_result)) int store_reconcile_claim(struct db *db, const char *owner,
                                                              int lease_seconds,
                                                              struct store_claim *out);
/* unknown → sending under the reconciler's lease (a transport retry under the same provider
 * key); updates c->lease_remaining_s and c->transport_attempts. STORE_ENOTFOUND when fenced. */
__attribute__((warn_unused_result)) int store_reconcile_send(struct db *db, struct store_claim *c,
                                                             int lease_seconds);

/* Claims an accepted operation due for a status read (or a cancel). STORE_ENOTFOUND when none. */
__attribute__((warn_unused_result)) int store_poll_claim(struct db *db, const char *owner,
                                                         int lease_seconds,
                                                         struct store_claim *out);

/* Cancels a tenant's job: a prepared job fails at once; an accepted one is marked for the
 * poller to send the provider's cancel, once. *changed is 0 when the job was already terminal
 * (out holds it as it is). */
__attribute__((warn_unused_result)) int store_cancel(struct db *db, const char *token,
                                                     const char *job_id, struct store_job *out,
                                                     int *changed);

struct store_webhook_req {
    const char *provider;
    const char *event_id;
    const char *remote_id;
    long window_hours;
    int is_signed;          /* 0: verify none — anyone could have sent it */
    const char *client_ref; /* our client reference named in the delivery, or NULL */
};

/* A webhook that passed verification (or whose profile has none). Signed: *fresh is 0 for an
 * event id seen before (nothing else happens); otherwise *hinted counts operations made due for
 * a status read (or, by client reference, for adoption of the named task) and *parked says the
 * task is not linked to an operation yet. Unsigned: nothing is written but a rate-limited hint. */
__attribute__((warn_unused_result)) int store_webhook(struct db *db,
                                                      const struct store_webhook_req *w,
                                                      int *fresh, int *hinted, int *parked);

/* An operator resumes polling of an accepted job whose poll deadline passed. */
__attribute__((warn_unused_result)) int store_resume_polling(struct db *db, const char *job_id,
                                                             long deadline_ms);

/* Claims the most overdue prepared operation (FOR UPDATE SKIP LOCKED): state sending, a new
 * lease_version (the fencing token) and a lease of lease_seconds of database time. Committed on
 * return, before any byte goes to the provider. STORE_ENOTFOUND when nothing is due. */
__attribute__((warn_unused_result)) int store_claim(struct db *db, const char *owner,
                                                    int lease_seconds, struct store_claim *out);

/* The result of one outbound call, written only if the claim still holds. */
struct store_finish {
    long long tenant_id;
    const char *id;
    long long lease_version;
    enum op_state from;   /* the state the claim holds: sending, or unknown for a reconcile */
    const char *kind;     /* 'create' or 'reconcile' */
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
    long long poll_deadline_ms; /* > 0: polling stops this long from now */
    const char *provider_status; /* canonical task status, or NULL */
    const char *outputs_json;    /* [{"url":…,"expires_at":…}] or NULL */
    int ambiguous;               /* the attempt may have made the task: set ambiguous_at */
    double started_at, finished_at; /* Unix seconds, from this host's clock */
};

/* Writes the outcome with `WHERE lease_version = $ AND state = 'sending'` and records the
 * attempt in the same statement. *applied is 0 when the claim was lost (fenced): the attempt is
 * then recorded with decision 'fenced' and the operation is unchanged. */
__attribute__((warn_unused_result)) int store_finish(struct db *db, const struct store_finish *f,
                                                     int *applied);

/* Provider credential breakers. */
__attribute__((warn_unused_result)) int store_breaker_trip(struct db *db, const char *provider,
                                                           int http_status, const char *reason,
                                                           const char *job_id);
/* *cleared is 1 when a breaker was removed. */
__attribute__((warn_unused_result)) int store_breaker_reset(struct db *db, const char *provider,
                                                            int *cleared);
__attribute__((warn_unused_result)) int store_breaker_list(
    struct db *db, void (*cb)(const char *provider, int status, const char *reason,
                              const char *tripped_at, void *arg),
    void *arg);

/* A tenant's jobs, oldest first, optionally in one state (NULL: all); cb gets each job. */
__attribute__((warn_unused_result)) int store_jobs_list(struct db *db, const char *token,
                                                        const char *state, int limit,
                                                        void (*cb)(const struct store_job *j,
                                                                   void *arg),
                                                        void *arg);

/* An operator's decision on a job in review: outcome found (→ new_state accepted or completed,
 * with remote_id), absent (→ prepared) or abandon (→ failed). *applied is 1 when this call moved
 * the job; otherwise out holds the job as it is (the caller compares). STORE_ENOTFOUND: no such
 * job for this tenant. */
__attribute__((warn_unused_result)) int store_resolve(struct db *db, const char *token,
                                                      const char *job_id, const char *outcome,
                                                      enum op_state new_state,
                                                      const char *remote_id, const char *by,
                                                      struct store_job *out, int *applied);

/* A new operation regenerating a terminal parent under a new key (see migrations). *created is
 * 1 for a new row, 0 for a replay of the key. STORE_ENOTFOUND when the parent is not a terminal
 * job of this tenant and the key is new. */
__attribute__((warn_unused_result)) int store_regenerate(struct db *db, const char *token,
                                                         const char *parent_id, const char *new_id,
                                                         const char *key, const char *fp_hex,
                                                         int fp_version, int ttl_hours,
                                                         struct store_job *out, int *created);

/* Turns up to `limit` operations whose sending lease expired into unknown; *count of them. */
__attribute__((warn_unused_result)) int store_reap(struct db *db, int limit, int *count);

/* Deletes up to `limit` expired webhook events and stale parked hints; *count of them. */
__attribute__((warn_unused_result)) int store_janitor(struct db *db, int limit, int *count);

/* Subscribes this connection to a NOTIFY channel. */
__attribute__((warn_unused_result)) int store_listen(struct db *db, const char *channel);
/* Waits up to timeout_ms for a notification on this connection, or for wake_fd (if >= 0) to
 * become readable, then calls cb(payload, arg) for each notification received. Returns the
 * number received, or STORE_EUNAVAIL. */
int store_wait_notify(struct db *db, int timeout_ms, int wake_fd,
                      void (*cb)(const char *payload, void *arg), void *arg);

/* Of the job ids given, those that are terminal: cb(id, arg) for each. */
__attribute__((warn_unused_result)) int store_terminal_ids(struct db *db, const char *const *ids,
                                                           size_t n,
                                                           void (*cb)(const char *id, void *arg),
                                                           void *arg);

__attribute__((warn_unused_result)) int store_tenant_add(struct db *db, const char *name,
                                                         const char *token_sha256_hex);
__attribute__((warn_unused_result)) int store_tenant_revoke(struct db *db, const char *name);
/* Calls cb for every tenant: name, created_at, revoked_at (NULL when live). */
__attribute__((warn_unused_result)) int store_tenant_list(struct db *db,
                                                          void (*cb)(const char *name,
                                                                     const char *created,
                                                                     const char *revoked,
                                                                     void *arg),
                                                          void *arg);

/* Gauges: ("state", name, count) for every state and ("tripped", provider, 1). */
__attribute__((warn_unused_result)) int store_gauges(
    struct db *db, void (*cb)(const char *kind, const char *name, long long value, void *arg),
    void *arg);

/* Operator commands across tenants (the CLI). */
__attribute__((warn_unused_result)) int store_admin_jobs_list(
    struct db *db, const char *state, int limit,
    void (*cb)(const struct store_job *j, void *arg), void *arg);
__attribute__((warn_unused_result)) int store_admin_job_get(struct db *db, const char *job_id,
                                                            struct store_job *out);
/* The token hash of the tenant owning job_id, so tenant-scoped statements can be reused. */
__attribute__((warn_unused_result)) int store_admin_token_of(struct db *db, const char *job_id,
                                                             char out[65]);

/* The newest applied migration (0 when none), for readiness. */
__attribute__((warn_unused_result)) int store_schema_version(struct db *db, int *version);

#endif
