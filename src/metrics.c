#include "idemgate/metrics.h"

#include "idemgate/http_server.h"
#include "idemgate/jobcache.h"
#include "idemgate/livestream.h"

#include "idemgate/classify.h"

#include <dirent.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* The build's identity (idemgate_build_info): the Makefile passes the commit it was built from
 * when it knows one (a build from a git checkout). */
#ifndef IG_VERSION
#define IG_VERSION "0.1.0"
#endif
#ifndef IG_GIT_COMMIT
#define IG_GIT_COMMIT ""
#endif

static const char *const route_names[MR__COUNT] = {
    "intake", "job_get", "job_list", "resolve", "regenerate", "cancel",
    "webhook", "admin", "healthz", "readyz", "metrics", "console", "other", "usage",
};

static const char *const safety_names[MS__COUNT][2] = {
    {"idemgate_ambiguous_submissions_total", "creates sent without a definite answer"},
    {"idemgate_reconciled_without_resend_total", "unknown operations resolved by looking"},
    {"idemgate_protected_resends_total", "resends under the same provider idempotency key"},
    {"idemgate_suspected_duplicates_total", "operations several provider tasks claimed"},
    {"idemgate_fenced_writes_dropped_total", "stale workers' writes dropped by fencing"},
    {"idemgate_review_entered_total", "operations handed to an operator"},
    {"idemgate_webhook_duplicates_total", "webhook deliveries of an event already seen"},
    {"idemgate_webhook_refused_total", "webhook deliveries whose signature did not verify"},
    {"idemgate_trips_refuted_total",
     "credential refusals the provider's probe then refuted: only their job failed, nothing "
     "tripped"},
    {"idemgate_stale_connections_refused_total",
     "kept-alive provider connections that had bytes waiting, a close or an error when a request "
     "was about to leave on them: nothing sent on them, the request went on a new connection"},
    {"idemgate_tasks_after_failure_total",
     "signed webhooks naming a task of a job that had ended failed (no task, it said): the job "
     "stays failed; the task (logged as task_after_failure) may be paid: read it at the provider"},
};

/* Status classes keep the label set small and fixed. */
#define N_STATUS 6 /* 1xx..5xx and "other" */
static const double buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                 0.25,  0.5,    1,     2.5,  5,     10,   30};
#define N_BUCKETS (sizeof(buckets) / sizeof(buckets[0]))

static atomic_ulong http_count[MR__COUNT][N_STATUS];
static atomic_ulong http_bucket[MR__COUNT][N_BUCKETS + 1];
static atomic_ulong http_sum_us[MR__COUNT];
/* The provider label set: the configured providers (metrics_providers, before any thread
 * observes), then "other" at METRICS_PROVIDERS_MAX. Read without a lock: it never changes once
 * the threads run. */
#define PROV_OTHER METRICS_PROVIDERS_MAX
static const char *prov_names[METRICS_PROVIDERS_MAX];
static size_t n_prov;

/* Upstream calls take from milliseconds (a status read) to minutes (a synchronous image);
 * jobs from seconds to days (a video in a provider's queue). */
static const double upstream_buckets[] = {0.05, 0.1, 0.25, 0.5, 1,  2.5, 5,
                                          10,   20,  30,   60,  120, 300};
#define N_UPSTREAM (sizeof(upstream_buckets) / sizeof(upstream_buckets[0]))
static const double job_buckets[] = {1,   5,    10,   30,   60,    120,   300,
                                     600, 1800, 3600, 7200, 21600, 86400};
#define N_JOB (sizeof(job_buckets) / sizeof(job_buckets[0]))

static atomic_ulong attempts[METRICS_PROVIDERS_MAX + 1][CLS__COUNT + 1];
static atomic_ulong upstream_bucket[METRICS_PROVIDERS_MAX + 1][N_UPSTREAM + 1];
static atomic_ulong upstream_sum_us[METRICS_PROVIDERS_MAX + 1];
static atomic_ulong job_bucket[METRICS_PROVIDERS_MAX + 1][N_JOB + 1];
static atomic_ulong job_sum_ms[METRICS_PROVIDERS_MAX + 1];
static atomic_ulong safety[MS__COUNT];
static atomic_ulong unknown_bucket[N_BUCKETS + 1];
static atomic_ulong unknown_sum_ms;
static atomic_ulong intake_batches[2]; /* [committed as one] */
/* The batch statements (db_run_rows) and what became of their rows. */
static const char *const db_rows_stmts[] = {"intake_rows", "begin_send_rows", "finish_rows",
                                            "archive_finish_rows"};
#define N_DB_ROWS_STMTS (sizeof(db_rows_stmts) / sizeof(db_rows_stmts[0]))
static atomic_ulong db_rows[N_DB_ROWS_STMTS][3]; /* answered, unanswered, failed */
static atomic_ulong intake_batched;
static atomic_ulong intake_born_claimed;
static atomic_long calls_in_flight, calls_in_flight_peak;
static atomic_ulong wait_answers[2]; /* [0] by a read of the job, [1] from memory */
static atomic_ulong archive_outcomes[3]; /* archived, failed, expired */
static const char *const poll_read_names[] = {"ok",      "refused", "not_found",
                                              "limited", "error",   "unanswered"};
#define N_POLL_READ (sizeof(poll_read_names) / sizeof(poll_read_names[0]))
static atomic_ulong poll_reads[METRICS_PROVIDERS_MAX + 1][N_POLL_READ];
/* 1 while this replica cannot read the provider's credential (credwatch.h). */
static atomic_int credential_unusable[METRICS_PROVIDERS_MAX + 1];
static atomic_ulong archive_claimed[2]; /* by a claim, by the write of the result */
static atomic_ulong archive_reads_unserved[MAR__COUNT];
static const char *const archive_read_names[MAR__COUNT] = {"other_replica", "other_store",
                                                           "unavailable", "busy"};

/* Spend by (provider, currency): labels are configured names, registered on first use. */
#define N_SPEND 64
static struct {
    const char *provider, *currency;
    atomic_ullong micros;
    atomic_ulong jobs;
    atomic_ulong unlisted; /* of those, priced by nothing: a model the table does not list */
} spend[N_SPEND + 1];
static atomic_int n_spend;
static pthread_mutex_t spend_mu = PTHREAD_MUTEX_INITIALIZER;

void metrics_providers(const char *const *names, const char *const *currencies, size_t n)
{
    n_prov = 0;
    for (size_t i = 0; i < n && n_prov < METRICS_PROVIDERS_MAX; i++)
        prov_names[n_prov++] = names[i];
    /* The spend series of every priced provider exist from the start, at 0: a provider with no
     * settled job yet is a 0, not a missing series (increase() and alerts need the 0). */
    pthread_mutex_lock(&spend_mu);
    for (size_t i = 0; i < n && currencies; i++) {
        int k = atomic_load(&n_spend), j = 0;
        if (!names[i] || !currencies[i])
            continue;
        while (j < k && (strcmp(spend[j].provider, names[i]) ||
                         strcmp(spend[j].currency, currencies[i])))
            j++;
        if (j == k && k < N_SPEND) {
            spend[k].provider = names[i];
            spend[k].currency = currencies[i];
            atomic_store(&n_spend, k + 1);
        }
    }
    pthread_mutex_unlock(&spend_mu);
}

/* The provider's place in the label set: a configured name, or "other". */
static size_t prov_index(const char *provider)
{
    for (size_t i = 0; provider && i < n_prov; i++)
        if (strcmp(prov_names[i], provider) == 0)
            return i;
    return PROV_OTHER;
}

static const char *prov_name(size_t i)
{
    return i < n_prov ? prov_names[i] : "other";
}

/* One observation of a histogram: its bucket (the first bound not below v, else +Inf) and its
 * sum, in units of 1/scale seconds. Two atomic additions, no lock. */
static void observe(const double *bounds, size_t n, atomic_ulong *bucket, atomic_ulong *sum,
                    double scale, double v)
{
    if (!(v >= 0))
        v = 0;
    size_t b = 0;
    while (b < n && v > bounds[b])
        b++;
    atomic_fetch_add(&bucket[b], 1);
    atomic_fetch_add(sum, (unsigned long)(v * scale));
}

void metrics_upstream_seconds(const char *provider, double seconds)
{
    size_t i = prov_index(provider);
    observe(upstream_buckets, N_UPSTREAM, upstream_bucket[i], &upstream_sum_us[i], 1e6, seconds);
}

void metrics_job_seconds(const char *provider, double seconds)
{
    size_t i = prov_index(provider);
    observe(job_buckets, N_JOB, job_bucket[i], &job_sum_ms[i], 1e3, seconds);
}

void metrics_spend(const char *provider, const char *currency, long long micros, int unlisted)
{
    if (!provider || !currency || micros < 0)
        return;
    int n = atomic_load(&n_spend), i = 0;
    while (i < n && (strcmp(spend[i].provider, provider) || strcmp(spend[i].currency, currency)))
        i++;
    if (i == n) {
        pthread_mutex_lock(&spend_mu);
        n = atomic_load(&n_spend);
        while (i < n && (strcmp(spend[i].provider, provider) || strcmp(spend[i].currency, currency)))
            i++;
        if (i == n && n < N_SPEND) {
            spend[n].provider = provider;
            spend[n].currency = currency;
            atomic_store(&n_spend, n + 1);
        } else if (i == n) {
            i = N_SPEND; /* "other" */
            spend[i].provider = "other";
            spend[i].currency = "other";
        }
        pthread_mutex_unlock(&spend_mu);
    }
    atomic_fetch_add(&spend[i].micros, (unsigned long long)micros);
    atomic_fetch_add(&spend[i].jobs, 1);
    if (unlisted)
        atomic_fetch_add(&spend[i].unlisted, 1);
}

static const double unknown_buckets[] = {1, 5, 15, 60, 300, 900, 1800, 3600, 7200, 21600,
                                         43200, 86400, 172800, 604800};

const char *metrics_route_name(int route)
{
    return (unsigned)route < MR__COUNT ? route_names[route] : "other";
}

void metrics_http(enum metric_route route, int status, double seconds)
{
    if ((unsigned)route >= MR__COUNT)
        route = MR_OTHER;
    int cls = status >= 100 && status < 600 ? status / 100 - 1 : 5;
    atomic_fetch_add(&http_count[route][cls], 1);
    size_t b = 0;
    while (b < N_BUCKETS && seconds > buckets[b])
        b++;
    atomic_fetch_add(&http_bucket[route][b], 1);
    atomic_fetch_add(&http_sum_us[route], (unsigned long)(seconds * 1e6));
}

void metrics_attempt(const char *provider, const char *outcome)
{
    size_t p = prov_index(provider);
    for (int i = 0; i < CLS__COUNT; i++) {
        if (strcmp(outcome, cls_name((enum cls_outcome)i)) == 0) {
            atomic_fetch_add(&attempts[p][i], 1);
            return;
        }
    }
    atomic_fetch_add(&attempts[p][CLS__COUNT], 1); /* lease_expired and other non-classes */
}

void metrics_poll_read(const char *provider, int http_status, int curl_code)
{
    int k = curl_code || !http_status                     ? 5
            : http_status >= 200 && http_status < 300     ? 0
            : http_status == 401 || http_status == 403    ? 1
            : http_status == 404 || http_status == 410    ? 2
            : http_status == 429                          ? 3
                                                          : 4;
    atomic_fetch_add(&poll_reads[prov_index(provider)][k], 1);
}

void metrics_credential_unusable(const char *provider, int unusable)
{
    atomic_store(&credential_unusable[prov_index(provider)], unusable ? 1 : 0);
}

void metrics_archive(int outcome)
{
    if (outcome >= 0 && outcome < 3)
        atomic_fetch_add(&archive_outcomes[outcome], 1);
}

void metrics_archive_claimed(int born)
{
    atomic_fetch_add(&archive_claimed[born ? 1 : 0], 1);
}

void metrics_archive_read_unserved(enum metric_archive_read why)
{
    if ((unsigned)why < MAR__COUNT)
        atomic_fetch_add(&archive_reads_unserved[why], 1);
}

void metrics_safety(enum metric_safety what)
{
    if ((unsigned)what < MS__COUNT)
        atomic_fetch_add(&safety[what], 1);
}

void metrics_unknown_seconds(double seconds)
{
    size_t b = 0;
    while (b < N_BUCKETS && seconds > unknown_buckets[b])
        b++;
    atomic_fetch_add(&unknown_bucket[b], 1);
    atomic_fetch_add(&unknown_sum_ms, (unsigned long)(seconds * 1000));
}

void metrics_intake_batch(size_t intents, int committed, int born_claimed)
{
    atomic_fetch_add(&intake_batches[committed ? 1 : 0], 1);
    atomic_fetch_add(&intake_batched, intents);
    atomic_fetch_add(&intake_born_claimed, (unsigned long)born_claimed);
}

void metrics_db_rows(const char *stmt, size_t answered, size_t unanswered, size_t failed)
{
    for (size_t i = 0; i < N_DB_ROWS_STMTS; i++)
        if (strcmp(db_rows_stmts[i], stmt) == 0) {
            atomic_fetch_add(&db_rows[i][0], answered);
            atomic_fetch_add(&db_rows[i][1], unanswered);
            atomic_fetch_add(&db_rows[i][2], failed);
        }
}

void metrics_wait_answer(int from_memory)
{
    atomic_fetch_add(&wait_answers[from_memory ? 1 : 0], 1);
}

void metrics_calls_in_flight(int delta)
{
    long now = atomic_fetch_add(&calls_in_flight, delta) + delta;
    long peak = atomic_load(&calls_in_flight_peak);
    while (now > peak && !atomic_compare_exchange_weak(&calls_in_flight_peak, &peak, now))
        ;
}

struct buf {
    char *p;
    size_t len, cap;
};

static void put(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(struct buf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0)
            return;
        if (b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap + (size_t)n) * 2;
        char *np = realloc(b->p, cap);
        if (!np)
            return;
        b->p = np;
        b->cap = cap;
    }
}

static const char *const status_names[N_STATUS] = {"1xx", "2xx", "3xx", "4xx", "5xx", "other"};

/* idemgate_http_requests_total: requests by route and status class. */
static void render_http_counts(struct buf *b)
{
    put(b, "# HELP idemgate_http_requests_total HTTP requests by route and status class.\n"
           "# TYPE idemgate_http_requests_total counter\n");
    for (int r = 0; r < MR__COUNT; r++)
        for (int s = 0; s < N_STATUS; s++)
            put(b, "idemgate_http_requests_total{route=\"%s\",status=\"%s\"} %lu\n",
                route_names[r], status_names[s], atomic_load(&http_count[r][s]));
}

/* idemgate_http_request_duration_seconds: one cumulative histogram per route. */
static void render_http_durations(struct buf *b)
{
    put(b, "# HELP idemgate_http_request_duration_seconds Time to answer, by route.\n"
           "# TYPE idemgate_http_request_duration_seconds histogram\n");
    for (int r = 0; r < MR__COUNT; r++) {
        unsigned long cum = 0;
        for (size_t i = 0; i < N_BUCKETS; i++) {
            cum += atomic_load(&http_bucket[r][i]);
            put(b, "idemgate_http_request_duration_seconds_bucket{route=\"%s\",le=\"%g\"} %lu\n",
                route_names[r], buckets[i], cum);
        }
        cum += atomic_load(&http_bucket[r][N_BUCKETS]);
        put(b,
            "idemgate_http_request_duration_seconds_bucket{route=\"%s\",le=\"+Inf\"} %lu\n"
            "idemgate_http_request_duration_seconds_sum{route=\"%s\"} %.6f\n"
            "idemgate_http_request_duration_seconds_count{route=\"%s\"} %lu\n",
            route_names[r], cum, route_names[r], (double)atomic_load(&http_sum_us[r]) / 1e6,
            route_names[r], cum);
    }
}

/* Whether a provider's row is printed: every configured provider (at 0 too), "other" once it
 * counted something. */
static int prov_shown(size_t p, unsigned long count)
{
    return p < n_prov || (p == PROV_OTHER && count > 0);
}

/* One cumulative histogram per provider (name: the family; sum in 1/scale seconds). */
static void render_provider_histogram(struct buf *b, const char *name, const char *help,
                                      const double *bounds, size_t n,
                                      atomic_ulong *bucket, atomic_ulong *sum, double scale)
{
    put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (size_t p = 0; p <= PROV_OTHER; p++) {
        atomic_ulong *bk = bucket + p * (n + 1); /* row p of [providers][n + 1] */
        unsigned long total = 0;
        for (size_t i = 0; i <= n; i++)
            total += atomic_load(&bk[i]);
        if (!prov_shown(p, total))
            continue;
        const char *pn = prov_name(p);
        unsigned long cum = 0;
        for (size_t i = 0; i < n; i++) {
            cum += atomic_load(&bk[i]);
            put(b, "%s_bucket{provider=\"%s\",le=\"%g\"} %lu\n", name, pn, bounds[i], cum);
        }
        cum += atomic_load(&bk[n]);
        put(b,
            "%s_bucket{provider=\"%s\",le=\"+Inf\"} %lu\n%s_sum{provider=\"%s\"} %.6f\n"
            "%s_count{provider=\"%s\"} %lu\n",
            name, pn, cum, name, pn, (double)atomic_load(&sum[p]) / scale, name, pn, cum);
    }
}

/* idemgate_attempts_total by provider and outcome class, the providers' latency histograms,
 * then one counter per safety event. */
static void render_attempts_and_safety(struct buf *b)
{
    put(b, "# HELP idemgate_attempts_total Outbound create attempts by provider and outcome "
           "class.\n# TYPE idemgate_attempts_total counter\n");
    for (size_t p = 0; p <= PROV_OTHER; p++) {
        unsigned long total = 0;
        for (int i = 0; i <= CLS__COUNT; i++)
            total += atomic_load(&attempts[p][i]);
        if (!prov_shown(p, total))
            continue;
        for (int i = 0; i <= CLS__COUNT; i++)
            put(b, "idemgate_attempts_total{provider=\"%s\",outcome=\"%s\"} %lu\n",
                prov_name(p), i < CLS__COUNT ? cls_name((enum cls_outcome)i) : "other",
                atomic_load(&attempts[p][i]));
    }
    put(b, "# HELP idemgate_poll_reads_total Status reads of async tasks by provider and what "
           "came back.\n# TYPE idemgate_poll_reads_total counter\n");
    for (size_t p = 0; p <= PROV_OTHER; p++) {
        unsigned long total = 0;
        for (size_t i = 0; i < N_POLL_READ; i++)
            total += atomic_load(&poll_reads[p][i]);
        if (!prov_shown(p, total))
            continue;
        for (size_t i = 0; i < N_POLL_READ; i++)
            put(b, "idemgate_poll_reads_total{provider=\"%s\",outcome=\"%s\"} %lu\n",
                prov_name(p), poll_read_names[i], atomic_load(&poll_reads[p][i]));
    }
    put(b, "# HELP idemgate_provider_credential_unusable 1 while this replica cannot read the "
           "provider's credential (its variable unset, its file unreadable or empty, a control "
           "character): it takes none of that provider's jobs.\n"
           "# TYPE idemgate_provider_credential_unusable gauge\n");
    for (size_t p = 0; p < n_prov; p++)
        put(b, "idemgate_provider_credential_unusable{provider=\"%s\"} %d\n", prov_name(p),
            atomic_load(&credential_unusable[p]));
    render_provider_histogram(
        b, "idemgate_upstream_duration_seconds",
        "Time of one call to a provider (a create, a status read), from send to its end.",
        upstream_buckets, N_UPSTREAM, &upstream_bucket[0][0], upstream_sum_us,
        1e6);
    render_provider_histogram(
        b, "idemgate_job_duration_seconds",
        "Time from a job's first send to the provider to its completion (completed jobs).",
        job_buckets, N_JOB, &job_bucket[0][0], job_sum_ms, 1e3);
    for (int i = 0; i < MS__COUNT; i++)
        put(b, "# HELP %s Count of %s.\n# TYPE %s counter\n%s %lu\n", safety_names[i][0],
            safety_names[i][1], safety_names[i][0], safety_names[i][0], atomic_load(&safety[i]));
}

/* idemgate_unknown_duration_seconds: how long operations stayed unknown. */
static void render_unknown(struct buf *b)
{
    put(b, "# HELP idemgate_unknown_duration_seconds Time operations spent in unknown.\n"
           "# TYPE idemgate_unknown_duration_seconds histogram\n");
    unsigned long cum = 0;
    for (size_t i = 0; i < N_BUCKETS; i++) {
        cum += atomic_load(&unknown_bucket[i]);
        put(b, "idemgate_unknown_duration_seconds_bucket{le=\"%g\"} %lu\n", unknown_buckets[i],
            cum);
    }
    cum += atomic_load(&unknown_bucket[N_BUCKETS]);
    put(b,
        "idemgate_unknown_duration_seconds_bucket{le=\"+Inf\"} %lu\n"
        "idemgate_unknown_duration_seconds_sum %.3f\nidemgate_unknown_duration_seconds_count %lu\n",
        cum, (double)atomic_load(&unknown_sum_ms) / 1000, cum);
}

/* The group commits of intake (recorder.c). */
static void render_intake(struct buf *b)
{
    put(b,
        "# HELP idemgate_intake_batches_total Group commits of intents; result=split: decided "
        "row by row.\n# TYPE idemgate_intake_batches_total counter\n"
        "idemgate_intake_batches_total{result=\"committed\"} %lu\n"
        "idemgate_intake_batches_total{result=\"split\"} %lu\n"
        "# HELP idemgate_intake_batched_intents_total Intents recorded by group commits.\n"
        "# TYPE idemgate_intake_batched_intents_total counter\n"
        "idemgate_intake_batched_intents_total %lu\n"
        "# HELP idemgate_intake_born_claimed_total New intents recorded already claimed and "
        "handed to this replica's dispatcher (one commit before send).\n"
        "# TYPE idemgate_intake_born_claimed_total counter\n"
        "idemgate_intake_born_claimed_total %lu\n"
        "# HELP idemgate_provider_calls_in_flight Provider calls (creates, status reads, "
        "reconcile searches, probes, archive copies) in "
        "flight in this replica (the call engine: none holds a thread or a database "
        "connection).\n"
        "# TYPE idemgate_provider_calls_in_flight gauge\n"
        "idemgate_provider_calls_in_flight %ld\n"
        "# HELP idemgate_provider_calls_in_flight_peak The most provider calls in flight at "
        "once in this replica since it started.\n"
        "# TYPE idemgate_provider_calls_in_flight_peak gauge\n"
        "idemgate_provider_calls_in_flight_peak %ld\n"
        "# HELP idemgate_wait_answers_total `Prefer: wait` clients answered after waiting: "
        "source=memory from the answer this replica just committed, source=read by reading "
        "the job.\n"
        "# TYPE idemgate_wait_answers_total counter\n"
        "idemgate_wait_answers_total{source=\"memory\"} %lu\n"
        "idemgate_wait_answers_total{source=\"read\"} %lu\n"
        "# HELP idemgate_live_streams Streamed creates whose events this replica relays to "
        "waiting clients as they arrive (from their intake to their first attempt's record).\n"
        "# TYPE idemgate_live_streams gauge\n"
        "idemgate_live_streams %zu\n"
        "# HELP idemgate_live_streams_spooled Live streams longer than stream_memory_bytes, "
        "their bytes in a spool file (stream_spool_dir) rather than memory.\n"
        "# TYPE idemgate_live_streams_spooled gauge\n"
        "idemgate_live_streams_spooled %ld\n"
        "# HELP idemgate_job_cache_bytes Bytes the terminal-job cache holds (its jobs' "
        "documents and answers; bounded by job_cache_bytes).\n"
        "# TYPE idemgate_job_cache_bytes gauge\n"
        "idemgate_job_cache_bytes %zu\n"
        "# HELP idemgate_http_body_bytes Bytes of request bodies held in memory now (while "
        "they arrive and until their request ends; bounded by max_buffered_body_bytes).\n"
        "# TYPE idemgate_http_body_bytes gauge\n"
        "idemgate_http_body_bytes %ld\n"
        "# HELP idemgate_http_body_bytes_untrusted Of them, the bodies of requests without a live "
        "tenant's or the operator's token (no token, an unknown one, webhooks; bounded by half "
        "of max_buffered_body_bytes).\n"
        "# TYPE idemgate_http_body_bytes_untrusted gauge\n"
        "idemgate_http_body_bytes_untrusted %ld\n",
        atomic_load(&intake_batches[1]), atomic_load(&intake_batches[0]),
        atomic_load(&intake_batched), atomic_load(&intake_born_claimed),
        atomic_load(&calls_in_flight), atomic_load(&calls_in_flight_peak),
        atomic_load(&wait_answers[1]), atomic_load(&wait_answers[0]), ls_count(), ls_spooled(),
        jobcache_bytes(), hs_body_bytes(), hs_body_bytes_untrusted());
    put(b, "# HELP idemgate_db_batch_rows_total Rows of batches written as one statement: "
           "result=answered written by it, unanswered left to the single-row statement (a key "
           "taken, a budget, a fenced write), failed carried by a statement that failed (then "
           "decided row by row).\n# TYPE idemgate_db_batch_rows_total counter\n");
    static const char *const results[] = {"answered", "unanswered", "failed"};
    for (size_t i = 0; i < N_DB_ROWS_STMTS; i++)
        for (size_t k = 0; k < 3; k++)
            put(b, "idemgate_db_batch_rows_total{statement=\"%s\",result=\"%s\"} %lu\n",
                db_rows_stmts[i], results[k], atomic_load(&db_rows[i][k]));
}

/* Settled cost by (provider, currency), with the "other" overflow pair when it was used: three
 * families, each printed whole. */
static void render_spend(struct buf *b)
{
    static const struct {
        const char *name, *help;
    } fam[3] = {
        {"idemgate_spend_micros_total",
         "Cost settled for completed operations, in micro-units of the currency, by provider "
         "(this replica; 0 for a priced provider with none yet)."},
        {"idemgate_settled_operations_total",
         "Completed operations whose cost was settled, by provider (this replica)."},
        {"idemgate_unpriced_operations_total",
         "Completed operations of a priced provider whose request its table prices nothing (a "
         "model it does not list, no fallback_per_output): cost 0, of tenants without an amount "
         "budget (which refuses them); add the price (this replica)."},
    };
    int ns = atomic_load(&n_spend);
    for (int f = 0; f < 3; f++) {
        put(b, "# HELP %s %s\n# TYPE %s counter\n", fam[f].name, fam[f].help, fam[f].name);
        for (int i = 0; i <= N_SPEND; i++) {
            if (i >= ns && (i < N_SPEND || !spend[i].provider))
                continue;
            unsigned long long v = f == 0   ? atomic_load(&spend[i].micros)
                                   : f == 1 ? atomic_load(&spend[i].jobs)
                                            : atomic_load(&spend[i].unlisted);
            put(b, "%s{provider=\"%s\",currency=\"%s\"} %llu\n", fam[f].name,
                spend[i].provider, spend[i].currency, v);
        }
    }
}

/* How archival of outputs ended, and reads of archived outputs this replica could not serve. */
static void render_archive(struct buf *b)
{
    put(b,
        "# HELP idemgate_archive_outputs_total Outputs whose archival ended: archived, failed "
        "(refused or out of attempts) or expired (the provider's URL expired before the copy; "
        "alert on it).\n# TYPE idemgate_archive_outputs_total counter\n"
        "idemgate_archive_outputs_total{outcome=\"archived\"} %lu\n"
        "idemgate_archive_outputs_total{outcome=\"failed\"} %lu\n"
        "idemgate_archive_outputs_total{outcome=\"expired\"} %lu\n",
        atomic_load(&archive_outcomes[0]), atomic_load(&archive_outcomes[1]),
        atomic_load(&archive_outcomes[2]));
    put(b,
        "# HELP idemgate_archive_claims_total Archive copies this replica claimed: by the write "
        "of their result (source=\"write\": no claim statement) or by a claim "
        "(source=\"claim\": the outputs the write could not take, and those of other replicas "
        "or earlier attempts).\n"
        "# TYPE idemgate_archive_claims_total counter\n"
        "idemgate_archive_claims_total{source=\"write\"} %lu\n"
        "idemgate_archive_claims_total{source=\"claim\"} %lu\n",
        atomic_load(&archive_claimed[1]), atomic_load(&archive_claimed[0]));
    put(b, "# HELP idemgate_archive_reads_unserved_total Archived outputs this replica could not "
           "serve: stored in another replica's local archive folder (other_replica), in a store "
           "of another kind (other_store), or the store did not answer (unavailable).\n"
           "# TYPE idemgate_archive_reads_unserved_total counter\n");
    for (int i = 0; i < MAR__COUNT; i++)
        put(b, "idemgate_archive_reads_unserved_total{reason=\"%s\"} %lu\n",
            archive_read_names[i], atomic_load(&archive_reads_unserved[i]));
}

int metrics_parse_proc_stat(const char *stat, long clk_tck, long page_size,
                            struct metrics_proc *out)
{
    /* "pid (comm) state ppid ...": comm may hold anything, so fields count from its last ')'. */
    const char *p = stat ? strrchr(stat, ')') : NULL;
    if (!p || clk_tck <= 0 || page_size <= 0)
        return -1;
    unsigned long utime, stime, vsize;
    unsigned long long start;
    long rss;
    /* Fields 3 (state) to 24 (rss): utime 14, stime 15, starttime 22, vsize 23, rss 24. */
    if (sscanf(p + 1,
               " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %*d %*d %*d %*d %*d %*d "
               "%llu %lu %ld",
               &utime, &stime, &start, &vsize, &rss) != 5)
        return -1;
    out->cpu_seconds = (double)(utime + stime) / (double)clk_tck;
    out->virtual_bytes = (double)vsize;
    out->resident_bytes = (double)rss * (double)page_size;
    out->start_ticks = start;
    return 0;
}

/* Reads a small /proc file whole into buf (NUL-terminated); 0 or -1. */
static int read_small(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return n > 0 ? 0 : -1;
}

/* The boot time in Unix seconds (/proc/stat's btime), or -1. */
static long long boot_time(void)
{
    char buf[16384];
    if (read_small("/proc/stat", buf, sizeof(buf)) < 0)
        return -1;
    const char *l = strstr(buf, "\nbtime ");
    return l ? atoll(l + 7) : -1;
}

/* Open descriptors: the entries of /proc/self/fd but the one that reads them; -1 unknown. */
static long open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    long n = 0;
    char self[16];
    snprintf(self, sizeof(self), "%d", dirfd(d));
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.' && strcmp(e->d_name, self) != 0;
    closedir(d);
    return n;
}

/* The standard process_* set (as the Prometheus client libraries name it), from /proc; a figure
 * that cannot be read is left out rather than reported as 0. Then idemgate_build_info. */
static void render_process(struct buf *b)
{
    char stat[2048];
    struct metrics_proc pr;
    long tck = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    if (read_small("/proc/self/stat", stat, sizeof(stat)) == 0 &&
        metrics_parse_proc_stat(stat, tck, page, &pr) == 0) {
        put(b,
            "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
            "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.2f\n"
            "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
            "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %.0f\n"
            "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
            "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %.0f\n",
            pr.cpu_seconds, pr.resident_bytes, pr.virtual_bytes);
        long long boot = boot_time();
        if (boot > 0)
            put(b,
                "# HELP process_start_time_seconds Start time of the process since unix epoch in "
                "seconds.\n# TYPE process_start_time_seconds gauge\n"
                "process_start_time_seconds %.2f\n",
                (double)boot + (double)pr.start_ticks / (double)tck);
    }
    long fds = open_fds();
    if (fds >= 0)
        put(b,
            "# HELP process_open_fds Number of open file descriptors.\n"
            "# TYPE process_open_fds gauge\nprocess_open_fds %ld\n",
            fds);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        put(b,
            "# HELP process_max_fds Maximum number of open file descriptors.\n"
            "# TYPE process_max_fds gauge\nprocess_max_fds %llu\n",
            (unsigned long long)rl.rlim_cur);
    put(b,
        "# HELP idemgate_build_info The gateway's version and the git commit it was built from "
        "(revision \"unknown\" when the build did not know it); always 1.\n"
        "# TYPE idemgate_build_info gauge\n"
        "idemgate_build_info{version=\"%s\",revision=\"%s\"} 1\n",
        IG_VERSION, *IG_GIT_COMMIT ? IG_GIT_COMMIT : "unknown");
}

char *metrics_render(const char *extra)
{
    struct buf b = {malloc(16384), 0, 16384};
    if (!b.p)
        return NULL;
    b.p[0] = '\0';
    render_process(&b);
    render_http_counts(&b);
    render_http_durations(&b);
    render_attempts_and_safety(&b);
    render_unknown(&b);
    render_intake(&b);
    render_spend(&b);
    render_archive(&b);
    if (extra)
        put(&b, "%s", extra);
    return b.p;
}
