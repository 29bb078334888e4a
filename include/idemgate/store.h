#ifndef IDEMGATE_STORE_H
#define IDEMGATE_STORE_H

#include "idemgate/db.h"
#include "idemgate/states.h"

#include <stddef.h>
#include <stdint.h>

/* "2026-12-02T10:39:31.123456Z" and its NUL. */
#define STORE_STAMP_LEN 28
/* The timestamps of a job row. */
#define STORE_JOB_STAMPS 8

/* Tenant-scoped reads and writes of PostgreSQL, the single source of truth: intake, a tenant's
 * jobs, cancel, resolve, regenerate, webhooks, tenants, provider breakers, gauges and the
 * operator's reads. The connection (`struct db`, one per thread) and the error codes are db.h's;
 * what workers write under a lease (claim, finish, reap) is lease.h's. Cancel, resolve,
 * regenerate and a breaker reset tell wake.h, once committed, of an operation they left
 * prepared (or made claimable), completed or failed. */

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
    const char *currency;      /* of the provider's price table; NULL: not priced */
    long long reserved_micros; /* the estimate reserved at intake */
    long long cost_micros;     /* settled when the job ended; -1 until then */
    const char *tenant;        /* its tenant's name: the operator's reads only (NULL otherwise) */
    /* The archive of its outputs as a JSON array (archive_job_outputs), owned; NULL when not
     * read. */
    char *archive;
    int archive_settled; /* planned, nothing pending: the archive view no longer changes */
    char *own;           /* storage some strings above point into, owned; or NULL */
    /* The timestamps above, formatted (RFC 3339 UTC) from the row's Unix seconds: owned, on the
     * heap (a struct store_job may be copied once, then only the copy finalised). */
    char (*stamps)[STORE_STAMP_LEN];
    int n_stamps;
};
void store_job_fini(struct store_job *j);

struct store_intake_req {
    long long tenant_id; /* the tenant directory's (tenants.h) */
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
    /* Born claimed: a new row is committed `sending` under this owner's lease of lease_seconds
     * (fencing token 1), for a dispatch slot of this replica that waits for it — one commit
     * before the send instead of two. NULL: the row is `prepared`, for any dispatcher. */
    const char *claim_owner;
    int lease_seconds;
    /* The cost estimate (price table × outputs asked for, pricing.h) reserved against the
     * tenant's budget in the same commit, in micro-units of currency (NULL: not priced). */
    long long reserve_micros;
    const char *currency;
    int unpriced; /* the price table priced this request with nothing (pricing.h) */
    /* When the request was recorded and when its job expires (RFC 3339 UTC, store_stamp): the
     * row's created_at and expires_at, and the new job's answer, to the microsecond. */
    char at[STORE_STAMP_LEN], expires_at[STORE_STAMP_LEN];
};

/* The intake decision: insert the intent (committed on return) or read the row that holds the
 * key. *created is 1 for a new row: the caller then calls wake_work (wake.h); out is then made
 * from r itself (its strings are r's: r must outlive out). A racing insert is re-read, never
 * reported as an error. A tenant with a budget (tenant_budgets) has its row locked, the estimate
 * reserved and the job counted in flight in the same commit; a new key the budget cannot take is
 * refused (STORE_EOVERDAY, STORE_EOVERMONTH, STORE_EINFLIGHT, STORE_EUNPRICED) and nothing is
 * recorded, while a key that exists is replayed as always, never charged again. */
__attribute__((warn_unused_result)) int store_intake(struct db *db,
                                                     const struct store_intake_req *r,
                                                     struct store_job *out, int *created);

/* One intake of a batch: the request, and its answer once store_intake_batch returns. */
struct store_intake_item {
    struct store_intake_req q;
    int err;             /* store_intake's answer for this row */
    struct store_job job; /* when err is STORE_OK (the caller store_job_fini's it) */
    int created;
};

/* store_intake for many rows in one transaction and one round trip (group commit): every item
 * gets exactly the answer store_intake would have given it. Rows that meet a problem (a bad
 * racing insert, a statement that aborted the batch, a lost connection) are decided
 * again one by one, so one bad row never fails its neighbours and a duplicate inside the batch
 * gets the same job as its first occurrence. items should be sorted by (tenant, key): batches on
 * other connections then lock in the same order and cannot deadlock. Returns the batch's own
 * outcome (STORE_OK when it committed as one), for metrics; the items carry the answers. */
int store_intake_batch(struct db *db, struct store_intake_item *const *items, size_t n);

/* Pure: an answer of the intake function (migrations/0014, 0032) — 0 the key was taken, 1
 * inserted, 2 inserted reserved for the claim owner, 3 refused by the budget (*verdict 2..5), 4
 * the key is under a tombstone (its job deleted by retention) — and the
 * breaker's reason of a new intent whose provider is tripped (*blocked, into a); -1 for anything
 * else. */
int store_intake_answer(const char *a, int *verdict, const char **blocked);

/* Pure: an answer of the action functions (migrations/0023: cancel, resolve, regenerate) — '1'
 * it wrote, '0' the row exists and was left as it was, 'n' no such row, 'r' refused by the budget
 * (*verdict 2..5), 't' the key is under a tombstone (regenerate, migration 0032); 0 for
 * anything else. */
int store_action_answer(const char *a, int *verdict);

/* A tenant's job by id: STORE_ENOTFOUND (also another tenant's job) or STORE_OK. */
__attribute__((warn_unused_result)) int store_job_get(struct db *db, long long tenant_id,
                                                      const char *job_id, struct store_job *out);

/* Cancels a tenant's job: a prepared job fails at once; an accepted one is marked for the
 * poller to send the provider's cancel, once. *changed is 0 when the job was already terminal
 * (out holds it as it is). */
__attribute__((warn_unused_result)) int store_cancel(struct db *db, long long tenant_id,
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
 * task is not linked to an operation yet; late (late_len bytes, "" when none) is the id of a
 * job that ended `failed` the delivery names — by client reference, one ended without a task;
 * by the task's id, one an operator ended failed with it (`abandon`): nothing is written, a
 * terminal row never changes, and the caller says it (a task that may be paid).
 * Unsigned: nothing is written but a rate-limited hint. */
__attribute__((warn_unused_result)) int store_webhook(struct db *db,
                                                      const struct store_webhook_req *w,
                                                      int *fresh, int *hinted, int *parked,
                                                      char *late, size_t late_len);

/* An operator resumes polling of a job its poll deadline sent to review (or of an accepted one):
 * accepted, polled for deadline_ms more. */
__attribute__((warn_unused_result)) int store_resume_polling(struct db *db, const char *job_id,
                                                             long deadline_ms);

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

/* A page of a tenant's jobs: newest first (created_at, then id), those created before the job
 * (before_at, before_id) — a cursor's, jobpage.h — or from the newest (NULL, NULL); filtered by
 * state, provider and idempotency key (NULL: any); at most limit. */
struct store_jobs_query {
    const char *state, *provider, *key;
    const char *before_at; /* RFC 3339 UTC stamp with microseconds */
    const char *before_id;
    int limit;
};
/* cb gets each job of the page, in order. */
__attribute__((warn_unused_result)) int store_jobs_list(struct db *db, long long tenant_id,
                                                        const struct store_jobs_query *q,
                                                        void (*cb)(const struct store_job *j,
                                                                   void *arg),
                                                        void *arg);

/* An operator's decision on a job in review: outcome found (→ new_state accepted or completed,
 * with remote_id), absent (→ prepared) or abandon (→ failed), written only while the job is in
 * review under the fencing token the decision was made on (lease_version, as read). *applied is
 * 1 when this call moved the job; otherwise out holds the job as it is (the caller compares).
 * STORE_ENOTFOUND: no such job for this tenant. The resolution records `tenant` (its name) and
 * `by`. */
__attribute__((warn_unused_result)) int store_resolve(struct db *db, long long tenant_id,
                                                      const char *tenant,
                                                      const char *job_id, const char *outcome,
                                                      enum op_state new_state,
                                                      const char *remote_id, const char *by,
                                                      long long lease_version,
                                                      struct store_job *out, int *applied);

/* A new operation regenerating a terminal parent under a new key (see migrations). *created is
 * 1 for a new row, 0 for a replay of the key. STORE_ENOTFOUND when the parent is not a terminal
 * job of this tenant and the key is new. */
__attribute__((warn_unused_result)) int store_regenerate(struct db *db, long long tenant_id,
                                                         const char *parent_id, const char *new_id,
                                                         const char *key, const char *fp_hex,
                                                         int fp_version, int ttl_hours,
                                                         struct store_job *out, int *created);

/* Retention (retention.h): deletes up to `limit` each of expired terminal operations (with their
 * attempts), expired webhook events and stale parked hints; deleted[] counts them in enum
 * ret_kind order. */
__attribute__((warn_unused_result)) int store_janitor(struct db *db, int limit,
                                                     long long deleted[3]);

/* The archive's hook (issue 13 §1 owns the files): of the given lowercase hex sha256s, cb gets
 * each that no remaining operation's outputs reference ({"sha256": …} in outputs): files that may
 * be deleted once the janitor removed the jobs that held them. */
__attribute__((warn_unused_result)) int store_unreferenced_sha256(
    struct db *db, const char *const *sha256s, size_t n, void (*cb)(const char *sha256, void *arg),
    void *arg);

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

/* Sets a live tenant's limits (-1: the configuration's default); STORE_ENOTFOUND when there is
 * no live tenant of that name. */
__attribute__((warn_unused_result)) int store_tenant_limits_set(struct db *db, const char *name,
                                                                int rps, int burst, int waits);
/* cb(token hash, requests per second, burst, wait connections) for every live tenant; -1 for a
 * value left to the default. */
__attribute__((warn_unused_result)) int store_tenant_limits_all(
    struct db *db, void (*cb)(const char *token_sha256, int rps, int burst, int waits, void *arg),
    void *arg);

/* Gauges: ("state", name, count) for every state, ("tripped", provider, 1), ("budget", "day" or
 * "month", the largest share 0..1 of its amount limit any tenant has used this UTC day or month)
 * and ("archive", "pending", copies pending) and ("archive", "oldest_pending_seconds", age of the
 * oldest pending copy, 0 with none). The terminal states, budgets and archive figures are read at
 * most once a minute per replica and kept in between. */
__attribute__((warn_unused_result)) int store_gauges(
    struct db *db, void (*cb)(const char *kind, const char *name, double value, void *arg),
    void *arg);

/* Operator reads across tenants (the CLI and the admin API). A page of every tenant's jobs,
 * newest first (created_at, then id), those created before (before_at, before_id) — a cursor's,
 * jobpage.h — or from the newest (NULL, NULL); filtered by tenant name, state, provider and
 * idempotency key (NULL: any); at most limit. Each job carries its tenant's name. The rows read
 * grow with the tenants and the page, never with the history (each tenant's own index is read
 * for at most a page, and the pages merged). */
struct store_admin_jobs_query {
    const char *tenant, *state, *provider, *key;
    const char *before_at, *before_id;
    int limit;
};
__attribute__((warn_unused_result)) int store_admin_jobs_page(
    struct db *db, const struct store_admin_jobs_query *q,
    void (*cb)(const struct store_job *j, void *arg), void *arg);
/* The first page of store_admin_jobs_page in one state and of one provider (NULL: any). */
__attribute__((warn_unused_result)) int store_admin_jobs_list(
    struct db *db, const char *state, const char *provider, int limit,
    void (*cb)(const struct store_job *j, void *arg), void *arg);

/* One row of the operator's overview (GET /v1/admin/overview), by kind; strings are NULL when
 * absent and live only during the callback; numbers are decimal text.
 *   "doubt"  name: unknown or review; n: jobs in it; sub: the oldest one's id; a: seconds since
 *            its first send (its creation when never sent); b: that time, Unix seconds.
 *   "hour"   name: a state; n: jobs created in the UTC hour starting at a (Unix seconds) within
 *            the last 24 h that are in that state now.
 *   "spend"  tenant; name: provider; sub: the request's top-level "model" as a JSON string token
 *            (NULL: none, or a body over 64 KiB, which is not read); currency; n: jobs settled
 *            (completed or canceled) in the UTC day starting at b (Unix seconds), one of the
 *            last 30 (today's included); a: their cost in micro-units.
 *   "time"   name: provider; n: jobs completed in the last 24 h; a, b: the 50th and 95th
 *            percentiles of their creation → finish, seconds.
 *   "budget" tenant, currency; a, b: its day and month limits (NULL: none); c, d: what counts
 *            against them this UTC day and month. */
struct store_overview_row {
    const char *kind, *tenant, *name, *sub, *currency;
    long long n; /* -1: NULL */
    const char *a, *b, *c, *d;
};
__attribute__((warn_unused_result)) int store_admin_overview(
    struct db *db, void (*cb)(const struct store_overview_row *row, void *arg), void *arg);
__attribute__((warn_unused_result)) int store_admin_job_get(struct db *db, const char *job_id,
                                                            struct store_job *out);
/* One row of a job's attempt history (the attempts table): a send, a status read or a
 * reconciliation, its outcome class and the state it wrote. Strings are NULL when absent and
 * live only during the callback. */
struct store_attempt {
    long long seq, lease_version;
    const char *kind;     /* create, poll, reconcile, … */
    const char *outcome;  /* the outcome class (classify.h), or lease_expired */
    int http_status;      /* 0: no status line came back */
    int curl_code;        /* 0: none */
    long long bytes_sent; /* -1: not known */
    const char *decision; /* the state written, or fenced */
    const char *error;
    const char *started_at, *finished_at; /* RFC 3339, UTC */
};
/* The attempts of the job (tenant_id, job_id), oldest first: cb for each; none is not an error.
 */
__attribute__((warn_unused_result)) int store_job_attempts(
    struct db *db, long long tenant_id, const char *job_id,
    void (*cb)(const struct store_attempt *a, void *arg), void *arg);
/* The task id a verified webhook left on the job's row and nobody has read yet, into out (empty
 * when none); the newest outcome of its reconcile verdicts that saw its task without an id
 * (states.h, RECON_SAW_TASK) into seen (empty when none). STORE_OK, STORE_ENOTFOUND or an
 * error. */
__attribute__((warn_unused_result)) int store_job_hint(struct db *db, long long tenant_id,
                                                       const char *job_id, char *out, size_t cap,
                                                       char *seen, size_t seen_cap);
/* The tenant owning job_id (its id, its name into name[cap] and, unless NULL, its token hash: the
 * key of its limits), so tenant-scoped statements and the tenant gate apply to an operator's
 * action on the job as to the tenant's own. */
__attribute__((warn_unused_result)) int store_admin_tenant_of(struct db *db, const char *job_id,
                                                              long long *tenant_id, char *name,
                                                              size_t cap, char token_sha256[65]);

/* The tenant directory's reads (tenants.h): the live tenant whose token hash is token_sha256
 * (STORE_EAUTH: none; *id 0), and every live tenant. */
__attribute__((warn_unused_result)) int store_tenant_of_token(struct db *db,
                                                              const char *token_sha256,
                                                              long long *id, char *name,
                                                              size_t cap);
__attribute__((warn_unused_result)) int store_tenants_all(
    struct db *db, void (*cb)(long long id, const char *name, const char *token_sha256, void *arg),
    void *arg);
/* RFC 3339 UTC to the microsecond ("2026-12-02T10:39:31.123456Z") of Unix time sec + usec µs.
 * Pure. */
void store_stamp(long long sec, long usec, char out[STORE_STAMP_LEN]);
/* store_stamp of Unix seconds as PostgreSQL writes them ("1796209004.137369", "-1.5", "7"): 0, or
 * -1 when epoch is not such a number. Pure. */
int store_stamp_epoch(const char *epoch, char out[STORE_STAMP_LEN]);

/* One row of store_usage: usage (a sum) or, when usage is 0, a tenant with its budget. v[] is -1
 * where NULL. Usage: v[0] jobs, v[1] cost in micro-units of currency, group the provider, route
 * ("provider/route") or UTC day. Tenant: v[0] day limit, v[1] counted today, v[2] month limit,
 * v[3] counted this month, v[4] most jobs in flight, v[5] in flight (currency: the budget's;
 * NULL and all -1 without a budget). */
struct store_usage_row {
    int usage;
    const char *tenant, *group, *currency;
    long long v[6];
};

/* Usage of completed operations that finished in [from, to) (timestamps PostgreSQL reads; NULL:
 * from the start of this UTC month, to no end), by group_by (provider, route or day), and the
 * budgets: tenant_id a tenant's own only, or 0 (every tenant, or the one named tenant). Usage
 * rows come first. */
__attribute__((warn_unused_result)) int store_usage(
    struct db *db, long long tenant_id, const char *tenant, const char *from, const char *to,
    const char *group_by, void (*cb)(const struct store_usage_row *row, void *arg), void *arg);

/* A budget as set or stored: limits of -1 are none; STORE_BUDGET_KEEP (as set) leaves the stored
 * limit as it is (none on a new budget). */
#define STORE_BUDGET_KEEP (-2)
struct store_budget {
    char currency[8]; /* "" as set: the stored currency (USD on a new budget) */
    long long day_limit, month_limit, max_inflight;
    /* On STORE_OK: 0, or the store error of counting the written budget's jobs in flight again
     * (budget_recount, after its retries): the budget is written, its count maybe off by a job
     * that ended meanwhile — setting it again counts them. */
    int recount_err;
};
/* Sets a tenant's budget (*b: what is given; on return, the budget as stored);
 * STORE_ENOTFOUND without such a tenant; STORE_ECONFLICT when the currency changes and an amount
 * limit is kept (it would be the old amount in the new unit). store_budget_clear removes it
 * (STORE_ENOTFOUND when there was none). */
__attribute__((warn_unused_result)) int store_budget_set(struct db *db, const char *tenant,
                                                         struct store_budget *b);
__attribute__((warn_unused_result)) int store_budget_clear(struct db *db, const char *tenant);

/* The newest applied migration (0 when none), for readiness. */
__attribute__((warn_unused_result)) int store_schema_version(struct db *db, int *version);
/* The database's clock, in Unix seconds: the one clock every replica shares (leases, webhook
 * timestamps). 0 or a store error. */
__attribute__((warn_unused_result)) int store_db_now(struct db *db, long long *now);

/* The statements of this module, for the test that holds them to the state machine. */
const struct db_stmt *const *store_statements(size_t *n);

#endif
