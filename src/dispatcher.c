#include "idemgate/dispatcher.h"

#include "idemgate/classify.h"
#include "idemgate/crash.h"
#include "idemgate/log.h"
#include "idemgate/store.h"
#include "idemgate/upstream.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_RESPONSE_BYTES (16u * 1024 * 1024)
/* Margin kept between the last moment a worker may start sending and its lease's end, for
 * clock rate differences and the time the request takes to leave. */
#define LEASE_SEND_MARGIN_S 1.0
/* How long an operation that could not be sent here waits before any replica tries again. */
#define NOT_SENT_RETRY_MS 5000

struct dispatcher {
    const struct cfg *cfg;
    atomic_int stop;
    int stop_fd; /* an eventfd that wakes idle workers when stopping */
    int n;
    pthread_t *threads;
};

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Refuses to send once the lease is (nearly) over, by this host's monotonic clock, which keeps
 * counting while the process is stopped: a worker frozen past its lease wakes up, finds its
 * deadline gone, and sends nothing, because another replica may own the operation by now. */
static int lease_guard(void *arg)
{
    const double *deadline = arg;
    return mono_now() > *deadline ? -1 : 0;
}

static void noop_notify(const char *payload, void *arg)
{
    (void)payload;
    (void)arg;
}

/* Writes a result that needs no call: the operation was claimed but cannot be sent here. */
static void release_unsent(struct db *db, const struct store_claim *c, const char *why)
{
    struct store_finish f = {.tenant_id = c->tenant_id,
                             .id = c->id,
                             .lease_version = c->lease_version,
                             .state = ST_PREPARED,
                             .outcome = cls_name(CLS_NOT_SENT),
                             .error = why,
                             .retry_delay_ms = NOT_SENT_RETRY_MS,
                             .started_at = wall_now(),
                             .finished_at = wall_now()};
    int applied = 0;
    LOG(LOG_ERROR, "dispatch_not_sent", LS("job_id", c->id), LS("provider", c->provider),
        LS("error", why));
    if (store_finish(db, &f, &applied) < 0)
        LOG(LOG_WARN, "dispatch_result_lost", LS("job_id", c->id),
            LS("note", "the reaper will mark it unknown"));
}

static void dispatch_one(const struct cfg *cfg, struct db *db, const struct store_claim *c,
                         double claimed_mono)
{
    const struct cfg_provider *p = cfg_find_provider(cfg, c->provider, strlen(c->provider));
    char auth[1024];
    const char *secret = NULL;
    if (!p) {
        release_unsent(db, c, "provider is not configured on this replica");
        return;
    }
    if (*c->credential) {
        secret = getenv(c->credential);
        if (!secret || !*secret) {
            release_unsent(db, c, "the provider's credential variable is not set");
            return;
        }
        snprintf(auth, sizeof(auth), "%s%s", p->auth_prefix ? p->auth_prefix : "", secret);
    }
    double deadline = claimed_mono + c->lease_remaining_s - LEASE_SEND_MARGIN_S;
    struct up_request req = {.method = c->method,
                             .url = c->url,
                             .auth_header = secret ? p->auth_header : NULL,
                             .auth_value = secret ? auth : NULL,
                             .client_ref = c->id,
                             .body = (const char *)c->body,
                             .body_len = c->body_len,
                             .connect_timeout_ms = p->connect_timeout_ms,
                             .total_timeout_ms = p->total_timeout_ms,
                             .max_response_bytes = MAX_RESPONSE_BYTES,
                             .before_send = lease_guard,
                             .before_send_arg = &deadline};
    struct up_response res;
    double t0 = wall_now();
    up_call(&req, &res);
    double t1 = wall_now();
    explicit_bzero(auth, sizeof(auth));
    CRASH_POINT("after_response");

    struct cls_evidence ev = {.curl_code = res.curl_code,
                              .bytes_sent = res.bytes_sent,
                              .header_bytes = res.header_bytes,
                              .http_status = res.http_status};
    enum cls_outcome outcome = cls_classify(&ev);
    enum op_state next = cls_next_state(outcome);
    const char *error = res.curl_code ? res.error : NULL;
    char why[128];
    if (res.aborted_before_send) {
        /* Nothing left: the lease ran out before the request could be sent. */
        outcome = CLS_NOT_SENT;
        next = ST_PREPARED;
        error = "lease expired before sending";
    } else if (res.body_truncated && next == ST_COMPLETED) {
        snprintf(why, sizeof(why), "response larger than %u bytes", MAX_RESPONSE_BYTES);
        next = ST_UNKNOWN;
        error = why;
    } else if (next == ST_FAILED && !error) {
        snprintf(why, sizeof(why), "provider answered %d", res.http_status);
        error = why;
    }
    struct store_finish f = {.tenant_id = c->tenant_id,
                             .id = c->id,
                             .lease_version = c->lease_version,
                             .state = next,
                             .outcome = cls_name(outcome),
                             .http_status = res.http_status,
                             .curl_code = res.curl_code,
                             .bytes_sent = res.bytes_sent,
                             .resp_headers = res.headers_json,
                             .resp_body = res.body,
                             .resp_body_len = res.body_len,
                             .error = error,
                             .retry_delay_ms = 0,
                             .started_at = t0,
                             .finished_at = t1};
    int applied = 0;
    int e = store_finish(db, &f, &applied);
    CRASH_POINT("after_result_commit");
    if (e < 0)
        LOG(LOG_ERROR, "dispatch_result_lost", LS("job_id", c->id), LI("store_error", e),
            LS("note", "the lease will expire and the reaper will mark it unknown"));
    else if (!applied)
        LOG(LOG_WARN, "fenced_write_dropped", LS("job_id", c->id),
            LI("lease_version", c->lease_version));
    else
        LOG(LOG_INFO, "dispatched", LS("job_id", c->id), LS("provider", c->provider),
            LS("outcome", cls_name(outcome)), LS("state", st_name(next)),
            LI("http_status", res.http_status), LI("curl_code", res.curl_code),
            LI("bytes_sent", res.bytes_sent), LI("ms", (long long)((t1 - t0) * 1000)));
    up_response_fini(&res);
}

static void *worker_main(void *arg)
{
    struct dispatcher *d = arg;
    const struct cfg *cfg = d->cfg;
    struct db *db = store_db_open(cfg->database_url);
    unsigned listening_gen = 0;
    int backoff_ms = 100;
    if (!db)
        return NULL;
    while (!atomic_load(&d->stop)) {
        if (store_db_generation(db) != listening_gen || !store_db_ok(db)) {
            if (store_listen(db, "idemgate_work") == STORE_OK) {
                listening_gen = store_db_generation(db);
            } else {
                struct timespec ts = {backoff_ms / 1000, (backoff_ms % 1000) * 1000000L};
                nanosleep(&ts, NULL);
                backoff_ms = backoff_ms < 2000 ? backoff_ms * 2 : 2000;
                continue;
            }
        }
        backoff_ms = 100;
        struct store_claim c;
        int e = store_claim(db, cfg->instance_id, cfg->lease_seconds, &c);
        if (e == STORE_OK) {
            double claimed = mono_now();
            CRASH_POINT("after_sending_commit");
            dispatch_one(cfg, db, &c, claimed);
            store_claim_fini(&c);
            continue; /* there may be more due */
        }
        if (e == STORE_ENOTFOUND)
            (void)store_wait_notify(db, cfg->poll_interval_ms, d->stop_fd, noop_notify, NULL);
        /* Other errors: the loop reconnects and listens again. */
    }
    store_db_close(db);
    return NULL;
}

struct dispatcher *disp_start(const struct cfg *cfg)
{
    struct dispatcher *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    d->cfg = cfg;
    d->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    d->threads = calloc((size_t)cfg->dispatch_workers + 1, sizeof(pthread_t));
    if (!d->threads || d->stop_fd < 0) {
        if (d->stop_fd >= 0)
            close(d->stop_fd);
        free(d->threads);
        free(d);
        return NULL;
    }
    for (int i = 0; i < cfg->dispatch_workers; i++) {
        if (pthread_create(&d->threads[i], NULL, worker_main, d) != 0) {
            LOG(LOG_ERROR, "dispatch_start_failed", LI("worker", i));
            disp_stop(d);
            return NULL;
        }
        d->n++;
    }
    return d;
}

void disp_stop(struct dispatcher *d)
{
    if (!d)
        return;
    atomic_store(&d->stop, 1);
    /* The counter stays non-zero, so every idle worker's poll returns at once. */
    uint64_t one = 1;
    ssize_t w = write(d->stop_fd, &one, sizeof(one));
    (void)w;
    for (int i = 0; i < d->n; i++)
        pthread_join(d->threads[i], NULL);
    close(d->stop_fd);
    free(d->threads);
    free(d);
}
