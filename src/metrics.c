#include "idemgate/metrics.h"

#include "idemgate/classify.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
};

/* Status classes keep the label set small and fixed. */
#define N_STATUS 6 /* 1xx..5xx and "other" */
static const double buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                 0.25,  0.5,    1,     2.5,  5,     10,   30};
#define N_BUCKETS (sizeof(buckets) / sizeof(buckets[0]))

static atomic_ulong http_count[MR__COUNT][N_STATUS];
static atomic_ulong http_bucket[MR__COUNT][N_BUCKETS + 1];
static atomic_ulong http_sum_us[MR__COUNT];
static atomic_ulong attempts[CLS__COUNT + 1];
static atomic_ulong safety[MS__COUNT];
static atomic_ulong unknown_bucket[N_BUCKETS + 1];
static atomic_ulong unknown_sum_ms;
static atomic_ulong intake_batches[2]; /* [committed as one] */
static atomic_ulong intake_batched;
static atomic_ulong intake_born_claimed;
static atomic_long calls_in_flight, calls_in_flight_peak;
static atomic_ulong wait_answers[2]; /* [0] by a read of the job, [1] from memory */
static atomic_ulong archive_outcomes[3]; /* archived, failed, expired */
static atomic_ulong archive_reads_unserved[MAR__COUNT];
static const char *const archive_read_names[MAR__COUNT] = {"other_replica", "other_store",
                                                           "unavailable"};

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

void metrics_attempt(const char *outcome)
{
    for (int i = 0; i < CLS__COUNT; i++) {
        if (strcmp(outcome, cls_name((enum cls_outcome)i)) == 0) {
            atomic_fetch_add(&attempts[i], 1);
            return;
        }
    }
    atomic_fetch_add(&attempts[CLS__COUNT], 1); /* lease_expired and other non-classes */
}

void metrics_archive(int outcome)
{
    if (outcome >= 0 && outcome < 3)
        atomic_fetch_add(&archive_outcomes[outcome], 1);
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

/* idemgate_attempts_total by outcome class, then one counter per safety event. */
static void render_attempts_and_safety(struct buf *b)
{
    put(b, "# HELP idemgate_attempts_total Outbound create attempts by outcome class.\n"
           "# TYPE idemgate_attempts_total counter\n");
    for (int i = 0; i <= CLS__COUNT; i++)
        put(b, "idemgate_attempts_total{outcome=\"%s\"} %lu\n",
            i < CLS__COUNT ? cls_name((enum cls_outcome)i) : "other", atomic_load(&attempts[i]));
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
        "idemgate_wait_answers_total{source=\"read\"} %lu\n",
        atomic_load(&intake_batches[1]), atomic_load(&intake_batches[0]),
        atomic_load(&intake_batched), atomic_load(&intake_born_claimed),
        atomic_load(&calls_in_flight), atomic_load(&calls_in_flight_peak),
        atomic_load(&wait_answers[1]), atomic_load(&wait_answers[0]));
}

/* Settled cost by (provider, currency), with the "other" overflow pair when it was used. */
static void render_spend(struct buf *b)
{
    put(b, "# HELP idemgate_spend_micros_total Cost settled for completed operations, in "
           "micro-units of the currency, by provider (this replica).\n"
           "# TYPE idemgate_spend_micros_total counter\n"
           "# HELP idemgate_settled_operations_total Completed operations whose cost was "
           "settled, by provider (this replica).\n"
           "# TYPE idemgate_settled_operations_total counter\n"
           "# HELP idemgate_unpriced_operations_total Completed operations of a priced provider "
           "whose request its table prices nothing (a model it does not list, no "
           "fallback_per_output): cost 0, of tenants without an amount budget (which refuses "
           "them); add the price (this replica).\n"
           "# TYPE idemgate_unpriced_operations_total counter\n");
    int ns = atomic_load(&n_spend);
    for (int i = 0; i <= N_SPEND; i++) {
        if (i >= ns && (i < N_SPEND || !spend[i].provider))
            continue;
        put(b,
            "idemgate_spend_micros_total{provider=\"%s\",currency=\"%s\"} %llu\n"
            "idemgate_settled_operations_total{provider=\"%s\",currency=\"%s\"} %lu\n"
            "idemgate_unpriced_operations_total{provider=\"%s\",currency=\"%s\"} %lu\n",
            spend[i].provider, spend[i].currency, atomic_load(&spend[i].micros),
            spend[i].provider, spend[i].currency, atomic_load(&spend[i].jobs),
            spend[i].provider, spend[i].currency, atomic_load(&spend[i].unlisted));
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
    put(b, "# HELP idemgate_archive_reads_unserved_total Archived outputs this replica could not "
           "serve: stored in another replica's local archive folder (other_replica), in a store "
           "of another kind (other_store), or the store did not answer (unavailable).\n"
           "# TYPE idemgate_archive_reads_unserved_total counter\n");
    for (int i = 0; i < MAR__COUNT; i++)
        put(b, "idemgate_archive_reads_unserved_total{reason=\"%s\"} %lu\n",
            archive_read_names[i], atomic_load(&archive_reads_unserved[i]));
}

char *metrics_render(const char *extra)
{
    struct buf b = {malloc(16384), 0, 16384};
    if (!b.p)
        return NULL;
    b.p[0] = '\0';
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
