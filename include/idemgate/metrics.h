#ifndef IDEMGATE_METRICS_H
#define IDEMGATE_METRICS_H

#include <stddef.h>

/* Process-wide counters and histograms, lock-free (atomics), rendered in the Prometheus text
 * format. Labels come from small fixed sets only: never a key, a token, a tenant or a job id. */

enum metric_route {
    MR_INTAKE = 0, MR_JOB_GET, MR_JOB_LIST, MR_RESOLVE, MR_REGENERATE, MR_CANCEL, MR_WEBHOOK,
    MR_ADMIN, MR_HEALTH, MR_READY, MR_METRICS, MR_CONSOLE, MR_OTHER, MR_USAGE, MR__COUNT
};

/* Events counted for the promise itself. */
enum metric_safety {
    MS_AMBIGUOUS = 0,         /* a create sent without a definite answer */
    MS_RECONCILED_NO_RESEND,  /* an unknown resolved by looking, nothing resent */
    MS_PROTECTED_RESEND,      /* a resend under the same provider idempotency key */
    MS_SUSPECTED_DUPLICATE,   /* several provider tasks claim one operation */
    MS_FENCED_WRITE,          /* a stale worker's write dropped by the fencing token */
    MS_REVIEW_ENTERED,        /* an operation handed to an operator */
    MS_WEBHOOK_DUPLICATE,     /* a webhook event id seen before */
    MS_WEBHOOK_REFUSED,       /* a webhook whose signature did not verify */
    MS_TRIP_REFUTED,          /* a credential refusal the provider's probe then refuted */
    MS_STALE_CONNECTION,      /* a kept-alive connection with bytes waiting: not sent on */
    MS_TASK_AFTER_FAILURE,    /* a signed webhook named a task of a job ended failed */
    MS__COUNT
};

/* The label sets of the provider families: the configured providers, in order (names outlive
 * the counters: they belong to the configuration), and each one's price table currency (NULL:
 * not priced). Called once, before any thread observes anything; a provider named later is
 * counted as "other". The spend series of every priced provider start at 0. Past
 * METRICS_PROVIDERS_MAX providers, the rest are "other". */
#define METRICS_PROVIDERS_MAX 64
void metrics_providers(const char *const *names, const char *const *currencies, size_t n);

const char *metrics_route_name(int route);
void metrics_http(enum metric_route route, int status, double seconds);
/* An attempt's outcome class name (classify.h) — counted by name from a fixed list — for a
 * configured provider (anything else counts as "other"). */
void metrics_attempt(const char *provider, const char *outcome);
/* One status read of an async task (or a deferred sync one): counted by provider and by what
 * came back — ok (2xx), refused (401, 403), not_found (404, 410), limited (429), error (any
 * other status), unanswered (no answer: curl_code set). A read refused or not found leaves the
 * job `accepted` until its poll deadline (review): the alert on these is the early word. */
void metrics_poll_read(const char *provider, int http_status, int curl_code);
/* Whether this replica can read the provider's credential now (credwatch.h). */
void metrics_credential_unusable(const char *provider, int unusable);
/* How long one call to a provider took (a create, a status read), from send to its end. */
void metrics_upstream_seconds(const char *provider, double seconds);
/* A job of the provider completed, seconds after its first send. */
void metrics_job_seconds(const char *provider, double seconds);
void metrics_safety(enum metric_safety what);
/* An output's archival ended: 0 archived, 1 failed, 2 expired before it was copied. */
void metrics_archive(int outcome);
/* An archive copy claimed: by the write of its result (born 1, archive.h) or by a claim (0). */
void metrics_archive_claimed(int born);
/* Why an archived output could not be served by this replica (outputs.c). */
enum metric_archive_read {
    MAR_OTHER_REPLICA = 0, /* in another replica's local archive folder */
    MAR_OTHER_STORE,     /* in a store of another kind than this replica's */
    MAR_UNAVAILABLE,       /* this replica's store did not answer */
    MAR_BUSY,              /* archive_s3_reads_max bucket reads were in progress */
    MAR__COUNT
};
void metrics_archive_read_unserved(enum metric_archive_read why);
/* A `Prefer: wait` client woken by its job's end was answered from this replica's memory (1,
 * answers.h) or by a read of the job (0). */
void metrics_wait_answer(int from_memory);
/* Time an operation spent in unknown before it left it. */
void metrics_unknown_seconds(double seconds);

/* A group commit of intents (recorder.c): committed as one, or split (decided row by row); how
 * many of its new rows were born claimed and handed to a dispatcher. */
void metrics_intake_batch(size_t intents, int committed, int born_claimed);
/* A batch written as one statement (db_run_rows): how many of its rows the statement wrote and
 * answered, how many it left unanswered (their callers write them with the single-row statement)
 * and, when the statement failed, how many rows it carried (then decided row by row). stmt is
 * the statement's name; a name not among the batch statements is not counted. */
void metrics_db_rows(const char *stmt, size_t answered, size_t unanswered, size_t failed);
/* Provider calls in the call engine (creates, status reads): +1 when one is submitted, -1 when
 * it ended. */
void metrics_calls_in_flight(int delta);

/* The cost settled for a completed operation of a configured provider (names and currency
 * codes from the configuration, which outlives the counters: a bounded label set; past 64 pairs
 * they are counted under provider "other"). */
void metrics_spend(const char *provider, const char *currency, long long micros, int unlisted);

/* Renders everything process-local (the build, the process's /proc figures, the counters and
 * histograms), followed by `extra` (gauges read from the database by the caller, whole
 * families only), into a new string. Every family is printed once, its samples together
 * under its one # HELP and # TYPE. */
char *metrics_render(const char *extra);

/* Pure: reads /proc/<pid>/stat's text. CPU seconds (user + system), virtual and resident bytes,
 * and the start in clock ticks since boot; clk_tck and page_size as sysconf gives them. Returns 0,
 * or -1 when the text is not a stat line (the command may hold spaces and parentheses). */
struct metrics_proc {
    double cpu_seconds;
    double virtual_bytes, resident_bytes;
    unsigned long long start_ticks;
};
int metrics_parse_proc_stat(const char *stat, long clk_tck, long page_size,
                            struct metrics_proc *out);

#endif
