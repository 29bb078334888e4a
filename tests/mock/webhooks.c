/*
 * idemgate-mock: webhook deliveries of the asynchronous personalities (see webhooks.h).
 *
 * The queue is a list sorted by due time, guarded by queue_lock; the delivery thread
 * sleeps on queue_cond until the head is due.  Items queued without a delay are due now and
 * go to the tail in O(1); only delayed items are inserted by a scan.  The records are a
 * ring of the newest RECORD_MAX deliveries, guarded by record_lock.  An epoch, bumped by
 * every reset, keeps a delivery that was in progress during a reset out of the new records.
 */
#include "webhooks.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "reply.h"
#include "sign.h"

/* Most queued events and timers; more are dropped with one line on stderr. */
#define QUEUE_MAX 100000u

/* Most delivery records kept; older ones are forgotten first. */
#define RECORD_MAX 100000u

/* The whole time one delivery may take: connect, send, answer. */
#define DELIVERY_TIMEOUT_MS 2000L

/* How old a "stale" timestamp is: past the 5-minute tolerance of Standard Webhooks. */
#define STALE_SECONDS 600

/* The user id fal puts in X-Fal-Webhook-User-Id; the mock has a single account. */
#define FAL_USER_ID "mock"

/* One queued event or timer. */
struct queue_item {
    long long due_ms;
    unsigned long epoch;
    struct wh_event *event;        /* a delivery, or NULL for a timer */
    void (*fire)(const char *arg); /* a timer's callback */
    char arg[WH_TASK_ID_MAX];      /* a timer's argument */
    struct queue_item *next;
};

/* One delivery as GET /_webhooks shows it. */
struct record {
    char *task_id;
    char *url;
    char *event_id;
    char label[WH_LABEL_MAX];
    unsigned int attempt; /* 0 for the first copy of an event, then 1, 2, ... */
    long status;          /* the receiver's HTTP status, 0 when none came back */
    double time;          /* Unix seconds when the delivery started */
    enum wh_scheme scheme;
    bool bad_signature;
    bool stale_timestamp;
    char error[96]; /* libcurl's error when there was no answer, else empty */
};

static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queue_cond;
static struct queue_item *queue_head, *queue_tail;
static size_t queue_len;
static bool queue_stopping;
static bool queue_overflow_said;
static unsigned long epoch;
static pthread_t thread;
static bool thread_started;

static pthread_mutex_t record_lock = PTHREAD_MUTEX_INITIALIZER;
static struct record *records; /* a ring of RECORD_MAX, allocated on first use */
static size_t record_start, record_count;
static unsigned long long record_total;

/* Returns a monotonic clock reading in milliseconds. */
static long long now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Returns the wall-clock time as Unix seconds with a fractional part. */
static double now_unix(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Copies src into dst (size bytes); returns false when it does not fit. */
static bool copy_fits(char *dst, size_t size, const char *src)
{
    size_t len = strlen(src);

    if (len >= size)
        return false;
    memcpy(dst, src, len + 1);
    return true;
}

/*
 * Makes an event delivered once, without delay, taking ownership of body (a heap JSON
 * text).  Returns NULL when memory ran out or a string does not fit; body is freed then.
 */
struct wh_event *wh_event_new(const char *task_id, const char *event_id, const char *label,
                              const char *url, char *body, enum wh_scheme scheme)
{
    struct wh_event *ev = body ? calloc(1, sizeof(*ev)) : NULL;

    if (ev == NULL || !copy_fits(ev->task_id, sizeof(ev->task_id), task_id) ||
        !copy_fits(ev->event_id, sizeof(ev->event_id), event_id) ||
        !copy_fits(ev->label, sizeof(ev->label), label) || (ev->url = strdup(url)) == NULL) {
        free(ev);
        free(body);
        return NULL;
    }
    ev->body = body;
    ev->body_len = strlen(body);
    ev->scheme = scheme;
    ev->copies = 1;
    return ev;
}

/* Frees a list of events. */
void wh_event_free_all(struct wh_event *list)
{
    while (list) {
        struct wh_event *next = list->next;

        free(list->url);
        free(list->body);
        free(list);
        list = next;
    }
}

/* ---- Records ----------------------------------------------------------------------- */

/* Frees the strings of one record. */
static void record_clear(struct record *r)
{
    free(r->task_id);
    free(r->url);
    free(r->event_id);
    memset(r, 0, sizeof(*r));
}

/*
 * Records one delivery unless a reset happened since it started (its epoch is old).  The
 * oldest record makes room once RECORD_MAX are kept.
 */
static void record_add(const struct wh_event *ev, unsigned int attempt, long status, double time,
                       const char *error, unsigned long started_epoch)
{
    struct record r = {0};
    struct record *slot;
    bool current;

    r.task_id = strdup(ev->task_id);
    r.url = strdup(ev->url);
    r.event_id = strdup(ev->event_id);
    if (r.task_id == NULL || r.url == NULL || r.event_id == NULL) {
        record_clear(&r);
        return;
    }
    memcpy(r.label, ev->label, sizeof(r.label));
    r.attempt = attempt;
    r.status = status;
    r.time = time;
    r.scheme = ev->scheme;
    r.bad_signature = ev->bad_signature;
    r.stale_timestamp = ev->stale_timestamp;
    /* libcurl's message is cut to fit; the first words say what failed. */
    snprintf(r.error, sizeof(r.error), "%.*s", (int)sizeof(r.error) - 1, error ? error : "");

    pthread_mutex_lock(&queue_lock);
    current = started_epoch == epoch;
    pthread_mutex_unlock(&queue_lock);
    pthread_mutex_lock(&record_lock);
    if (records == NULL)
        records = calloc(RECORD_MAX, sizeof(*records));
    if (records == NULL || !current) {
        pthread_mutex_unlock(&record_lock);
        record_clear(&r);
        return;
    }
    if (record_count == RECORD_MAX) {
        slot = &records[record_start];
        record_clear(slot);
        record_start = (record_start + 1) % RECORD_MAX;
        record_count--;
    }
    slot = &records[(record_start + record_count) % RECORD_MAX];
    *slot = r;
    record_count++;
    record_total++;
    pthread_mutex_unlock(&record_lock);
}

/* Forgets every record. */
static void records_clear(void)
{
    pthread_mutex_lock(&record_lock);
    for (size_t i = 0; records && i < record_count; i++)
        record_clear(&records[(record_start + i) % RECORD_MAX]);
    record_start = record_count = 0;
    record_total = 0;
    pthread_mutex_unlock(&record_lock);
}

/* Returns the current epoch, which every reset bumps. */
static unsigned long current_epoch(void)
{
    unsigned long e;

    pthread_mutex_lock(&queue_lock);
    e = epoch;
    pthread_mutex_unlock(&queue_lock);
    return e;
}

/* ---- One delivery ------------------------------------------------------------------ */

/* libcurl write callback: the receiver's answer body is not needed. */
static size_t discard_body(char *data, size_t size, size_t n, void *cls)
{
    (void)data;
    (void)cls;
    return size * n;
}

/* libcurl progress callback: aborts the transfer once the mock is shutting down. */
static int abort_on_shutdown(void *cls, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                             curl_off_t ulnow)
{
    (void)cls;
    (void)dltotal;
    (void)dlnow;
    (void)ultotal;
    (void)ulnow;
    return mock_shutting_down() ? 1 : 0;
}

/* Appends "name: value" to *list; returns false when memory ran out. */
static bool add_header(struct curl_slist **list, const char *name, const char *value)
{
    char line[640];
    struct curl_slist *grown;

    snprintf(line, sizeof(line), "%s: %s", name, value);
    grown = curl_slist_append(*list, line);
    if (grown == NULL)
        return false;
    *list = grown;
    return true;
}

/*
 * Adds the signature headers of ev's scheme, signed at timestamp ts, to *list.  Returns
 * false when signing or memory failed.
 */
static bool add_signature(struct curl_slist **list, const struct wh_event *ev, long long ts)
{
    char stamp[32], sig[SIGN_ED25519_HEX_MAX];

    snprintf(stamp, sizeof(stamp), "%lld", ts);
    switch (ev->scheme) {
    case WH_STANDARD:
        return sign_standard(ev->event_id, stamp, ev->body, ev->body_len, ev->bad_signature, sig) &&
               add_header(list, "webhook-id", ev->event_id) &&
               add_header(list, "webhook-timestamp", stamp) &&
               add_header(list, "webhook-signature", sig);
    case WH_FAL_ED25519:
        return sign_fal(ev->task_id, FAL_USER_ID, stamp, ev->body, ev->body_len, ev->bad_signature,
                        sig) &&
               add_header(list, "X-Fal-Webhook-Request-Id", ev->task_id) &&
               add_header(list, "X-Fal-Webhook-User-Id", FAL_USER_ID) &&
               add_header(list, "X-Fal-Webhook-Timestamp", stamp) &&
               add_header(list, "X-Fal-Webhook-Signature", sig);
    case WH_HMAC_HEX:
        return sign_hmac_hex(ev->body, ev->body_len, ev->bad_signature, sig) &&
               add_header(list, "X-Webhook-Id", ev->event_id) &&
               add_header(list, "X-Signature", sig);
    case WH_UNSIGNED:
        return true;
    }
    return false;
}

/*
 * POSTs one copy of ev and records it.  Returns the receiver's HTTP status, or 0 when no
 * answer came back (refused, timed out, aborted by a shutdown).
 */
static long deliver_one(const struct wh_event *ev, unsigned int attempt)
{
    CURL *curl = curl_easy_init();
    struct curl_slist *headers = NULL;
    char error[CURL_ERROR_SIZE] = "";
    double started = now_unix();
    long long ts = (long long)started - (ev->stale_timestamp ? STALE_SECONDS : 0);
    long status = 0;
    unsigned long started_epoch = current_epoch();
    CURLcode rc = CURLE_OUT_OF_MEMORY;

    /* An empty Expect stops libcurl from waiting for "100 Continue" on larger bodies. */
    if (curl && add_header(&headers, "Content-Type", "application/json") &&
        add_header(&headers, "User-Agent", "idemgate-mock") && add_header(&headers, "Expect", "") &&
        add_signature(&headers, ev, ts)) {
        curl_easy_setopt(curl, CURLOPT_URL, ev->url);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, ev->body);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)ev->body_len);
        curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
        curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, DELIVERY_TIMEOUT_MS);
        curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(curl, CURLOPT_PROXY, "");
        /*
         * A fresh connection for every copy: libcurl would silently resend a POST whose
         * reused connection died, and the receiver would see a delivery nobody recorded.
         */
        curl_easy_setopt(curl, CURLOPT_FRESH_CONNECT, 1L);
        curl_easy_setopt(curl, CURLOPT_FORBID_REUSE, 1L);
        curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, discard_body);
        curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, abort_on_shutdown);
        curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
        rc = curl_easy_perform(curl);
        if (rc == CURLE_OK)
            curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    }
    if (rc != CURLE_OK && error[0] == '\0')
        snprintf(error, sizeof(error), "%s", curl_easy_strerror(rc));
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    record_add(ev, attempt, status, started, rc == CURLE_OK ? NULL : error, started_epoch);
    return status;
}

/*
 * Delivers every copy of every event of list in order, storing statuses as
 * webhooks_deliver_now() describes.  Stops early on a shutdown or a reset.  Returns the
 * deliveries made.
 */
static size_t deliver_list(const struct wh_event *list, int *statuses, size_t max)
{
    unsigned long start = current_epoch();
    size_t n = 0;

    for (const struct wh_event *ev = list; ev; ev = ev->next) {
        for (unsigned int i = 0;
             i < ev->copies && !mock_shutting_down() && current_epoch() == start; i++) {
            long status = deliver_one(ev, i);

            if (statuses && n < max)
                statuses[n] = (int)status;
            n++;
        }
    }
    return n;
}

/*
 * Delivers a list of events now, on the calling thread, in order, taking ownership.  Stores
 * the HTTP status of each delivery (0 when none came back) into statuses, up to max of them,
 * and returns how many deliveries were made.
 */
size_t webhooks_deliver_now(struct wh_event *list, int *statuses, size_t max)
{
    size_t n = deliver_list(list, statuses, max);

    wh_event_free_all(list);
    return n;
}

/* ---- The queue and its thread ------------------------------------------------------ */

/* Frees one queue item and its event. */
static void item_free(struct queue_item *it)
{
    wh_event_free_all(it->event);
    free(it);
}

/*
 * Inserts it into the sorted queue after every item due no later.  The caller holds
 * queue_lock.  Returns false (leaving it to the caller) when the queue is full.
 */
static bool queue_insert(struct queue_item *it)
{
    struct queue_item **link = &queue_head;

    if (queue_len >= QUEUE_MAX) {
        if (!queue_overflow_said)
            fprintf(stderr, "idemgate-mock: webhook queue full (%u), dropping events\n", QUEUE_MAX);
        queue_overflow_said = true;
        return false;
    }
    it->epoch = epoch;
    it->next = NULL;
    if (queue_tail == NULL || queue_tail->due_ms <= it->due_ms) {
        if (queue_tail)
            queue_tail->next = it;
        else
            queue_head = it;
        queue_tail = it;
    } else {
        while (*link && (*link)->due_ms <= it->due_ms)
            link = &(*link)->next;
        it->next = *link;
        *link = it;
    }
    queue_len++;
    pthread_cond_signal(&queue_cond);
    return true;
}

/*
 * Queues a list of events for the delivery thread, taking ownership.  Each is delivered
 * delay_ms after now, and events due at the same time go in the order they were queued.
 */
void webhooks_enqueue(struct wh_event *list)
{
    long long now = now_ms();

    while (list) {
        struct wh_event *ev = list;
        struct queue_item *it = calloc(1, sizeof(*it));
        bool queued = false;

        list = list->next;
        ev->next = NULL;
        if (it) {
            it->due_ms = now + ev->delay_ms;
            it->event = ev;
            pthread_mutex_lock(&queue_lock);
            queued = !queue_stopping && queue_insert(it);
            pthread_mutex_unlock(&queue_lock);
        }
        if (!queued) {
            if (it)
                it->event = NULL;
            free(it);
            wh_event_free_all(ev);
        }
    }
}

/*
 * Calls fire(arg) from the delivery thread ms milliseconds from now, unless a reset or a
 * shutdown comes first.  arg is copied (WH_TASK_ID_MAX bytes at most).  Returns false when
 * the queue is full or memory ran out.
 */
bool webhooks_after(unsigned int ms, void (*fire)(const char *arg), const char *arg)
{
    struct queue_item *it = calloc(1, sizeof(*it));
    bool queued;

    if (it == NULL || !copy_fits(it->arg, sizeof(it->arg), arg)) {
        free(it);
        return false;
    }
    it->due_ms = now_ms() + ms;
    it->fire = fire;
    pthread_mutex_lock(&queue_lock);
    queued = !queue_stopping && queue_insert(it);
    pthread_mutex_unlock(&queue_lock);
    if (!queued)
        free(it);
    return queued;
}

/* Removes and returns the queue's head.  The caller holds queue_lock; the queue is not empty. */
static struct queue_item *queue_pop(void)
{
    struct queue_item *it = queue_head;

    queue_head = it->next;
    if (queue_head == NULL)
        queue_tail = NULL;
    queue_len--;
    return it;
}

/* The delivery thread: runs every item when it is due, until webhooks_stop(). */
static void *delivery_main(void *cls)
{
    (void)cls;
    pthread_mutex_lock(&queue_lock);
    while (!queue_stopping) {
        struct queue_item *it;
        long long wait;

        if (queue_head == NULL) {
            pthread_cond_wait(&queue_cond, &queue_lock);
            continue;
        }
        wait = queue_head->due_ms - now_ms();
        if (wait > 0) {
            struct timespec until;

            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_sec += wait / 1000;
            until.tv_nsec += (wait % 1000) * 1000000;
            if (until.tv_nsec >= 1000000000) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&queue_cond, &queue_lock, &until);
            continue;
        }
        it = queue_pop();
        pthread_mutex_unlock(&queue_lock);
        /* A reset between the pop and here only costs a timer that finds no task. */
        if (it->event)
            deliver_list(it->event, NULL, 0);
        else
            it->fire(it->arg);
        item_free(it);
        pthread_mutex_lock(&queue_lock);
    }
    pthread_mutex_unlock(&queue_lock);
    return NULL;
}

/* Starts the delivery thread; call once, after sign_init().  Returns false when it failed. */
bool webhooks_start(void)
{
    pthread_condattr_t attr;

    if (pthread_condattr_init(&attr) != 0)
        return false;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (pthread_cond_init(&queue_cond, &attr) != 0) {
        pthread_condattr_destroy(&attr);
        return false;
    }
    pthread_condattr_destroy(&attr);
    thread_started = pthread_create(&thread, NULL, delivery_main, NULL) == 0;
    if (!thread_started)
        fprintf(stderr, "idemgate-mock: cannot start the webhook thread\n");
    return thread_started;
}

/* Detaches and frees every queued item.  The caller must not hold queue_lock. */
static void queue_clear(void)
{
    struct queue_item *it;

    pthread_mutex_lock(&queue_lock);
    it = queue_head;
    queue_head = queue_tail = NULL;
    queue_len = 0;
    epoch++;
    queue_overflow_said = false;
    pthread_mutex_unlock(&queue_lock);
    while (it) {
        struct queue_item *next = it->next;

        item_free(it);
        it = next;
    }
}

/*
 * Stops the delivery thread and frees whatever is queued or recorded.  Call after
 * mock_shutting_down() turned true, so a delivery in progress is cut short.
 */
void webhooks_stop(void)
{
    pthread_mutex_lock(&queue_lock);
    queue_stopping = true;
    pthread_cond_broadcast(&queue_cond);
    pthread_mutex_unlock(&queue_lock);
    if (thread_started)
        pthread_join(thread, NULL);
    thread_started = false;
    queue_clear();
    records_clear();
    pthread_mutex_lock(&record_lock);
    free(records);
    records = NULL;
    pthread_mutex_unlock(&record_lock);
}

/* Forgets the queued events and timers and the delivery records (POST /_reset). */
void webhooks_reset(void)
{
    queue_clear();
    records_clear();
}

/* ---- Routes ------------------------------------------------------------------------ */

/* The signature a record's deliveries carried: "none", "bad" or "valid". */
static const char *signature_word(const struct record *r)
{
    if (r->scheme == WH_UNSIGNED)
        return "none";
    return r->bad_signature ? "bad" : "valid";
}

/* Builds the JSON object of one record, or NULL when memory ran out. */
static cJSON *record_to_json(const struct record *r)
{
    cJSON *o = cJSON_CreateObject();

    if (o == NULL)
        return NULL;
    cJSON_AddStringToObject(o, "task_id", r->task_id);
    cJSON_AddStringToObject(o, "url", r->url);
    cJSON_AddStringToObject(o, "event_id", r->event_id);
    cJSON_AddStringToObject(o, "event", r->label);
    cJSON_AddNumberToObject(o, "attempt", r->attempt);
    cJSON_AddNumberToObject(o, "status", (double)r->status);
    cJSON_AddNumberToObject(o, "time", r->time);
    cJSON_AddStringToObject(o, "signature", signature_word(r));
    cJSON_AddBoolToObject(o, "stale_timestamp", r->stale_timestamp);
    if (r->error[0])
        cJSON_AddStringToObject(o, "error", r->error);
    else
        cJSON_AddNullToObject(o, "error");
    return o;
}

/* GET /_webhooks[?task_id=ID]: {"deliveries": [...], "count": N, "pending": M}. */
enum MHD_Result webhooks_handle_log(struct mock_request *req)
{
    const char *task = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "task_id");
    cJSON *doc = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(doc, "deliveries");
    bool ok = list != NULL;
    size_t pending;

    pthread_mutex_lock(&record_lock);
    for (size_t i = 0; ok && i < record_count; i++) {
        const struct record *r = &records[(record_start + i) % RECORD_MAX];
        cJSON *item;

        if (task && strcmp(task, r->task_id) != 0)
            continue;
        item = record_to_json(r);
        ok = item != NULL && cJSON_AddItemToArray(list, item);
    }
    cJSON_AddNumberToObject(doc, "count", (double)record_total);
    pthread_mutex_unlock(&record_lock);
    pthread_mutex_lock(&queue_lock);
    pending = queue_len;
    pthread_mutex_unlock(&queue_lock);
    cJSON_AddNumberToObject(doc, "pending", (double)pending);
    if (!ok) {
        cJSON_Delete(doc);
        return reply_error(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory", "mock_error",
                           "oom");
    }
    return reply_json(req, MHD_HTTP_OK, doc);
}

/* GET /_webhook_keys: {"ed25519_public_key": "<base64>", "keys": [JWK]}. */
enum MHD_Result webhooks_handle_keys(struct mock_request *req)
{
    char b64[SIGN_PUBLIC_KEY_B64_MAX], b64url[SIGN_PUBLIC_KEY_B64_MAX];
    cJSON *doc = cJSON_CreateObject();
    cJSON *keys = cJSON_AddArrayToObject(doc, "keys");
    cJSON *jwk = cJSON_CreateObject();

    sign_public_key_b64(b64);
    sign_public_key_b64url(b64url);
    cJSON_AddStringToObject(doc, "ed25519_public_key", b64);
    /* The same key as fal publishes its keys: a JWKS of one OKP key. */
    cJSON_AddStringToObject(jwk, "kty", "OKP");
    cJSON_AddStringToObject(jwk, "crv", "Ed25519");
    cJSON_AddStringToObject(jwk, "x", b64url);
    cJSON_AddStringToObject(jwk, "kid", "mock");
    cJSON_AddItemToArray(keys, jwk);
    return reply_json(req, MHD_HTTP_OK, doc);
}
