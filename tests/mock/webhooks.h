/*
 * idemgate-mock: webhook deliveries of the asynchronous personalities.
 *
 * An event is one webhook the provider sends about a task (its body, signature scheme and
 * target URL), delivered "copies" times.  Events are delivered either by one background
 * thread, in the order they were queued and after their delay, or synchronously by the
 * caller (a webhook that must arrive before a create is answered, or POST /_webhooks/send).
 * The same thread runs timers (a task that completes on its own).  Every delivery is
 * recorded for GET /_webhooks.  Each delivery uses its own libcurl handle and a fresh
 * connection, waits at most 2 s and is never retried: repetitions are only the copies a
 * test asked for.
 */
#ifndef IDEMGATE_MOCK_WEBHOOKS_H
#define IDEMGATE_MOCK_WEBHOOKS_H

#include <stdbool.h>
#include <stddef.h>

#include <microhttpd.h>

#include "mock.h"

/* Bytes a task id may take in an event, including the NUL. */
#define WH_TASK_ID_MAX 256
/* Bytes an event id may take, including the NUL. */
#define WH_EVENT_ID_MAX 320
/* Bytes a status label may take, including the NUL. */
#define WH_LABEL_MAX 32

/* How a provider signs its webhooks (see sign.h). */
enum wh_scheme {
    WH_UNSIGNED,    /* Luma: no signature */
    WH_STANDARD,    /* Replicate, OpenAI: Standard Webhooks */
    WH_FAL_ED25519, /* fal: X-Fal-Webhook-* headers, Ed25519 */
    WH_HMAC_HEX,    /* Higgsfield/Argil style: X-Signature, hex HMAC-SHA256 of the body */
};

/* One webhook event; a list of them is linked through next. */
struct wh_event {
    char task_id[WH_TASK_ID_MAX];
    char event_id[WH_EVENT_ID_MAX]; /* constant across the copies of the event */
    char label[WH_LABEL_MAX];       /* the provider's status the event reports */
    char *url;                      /* owned */
    char *body;                     /* owned, JSON text */
    size_t body_len;
    enum wh_scheme scheme;
    unsigned int copies;   /* deliveries of this event, 1 + duplicates */
    unsigned int delay_ms; /* counted from when the event is queued */
    bool bad_signature;    /* the signature is well formed but wrong */
    bool stale_timestamp;  /* the timestamp is 10 minutes old (and signed as such) */
    struct wh_event *next;
};

/*
 * Makes an event delivered once, without delay, taking ownership of body (a heap JSON
 * text).  Returns NULL when memory ran out or a string does not fit; body is freed then.
 */
struct wh_event *wh_event_new(const char *task_id, const char *event_id, const char *label,
                              const char *url, char *body, enum wh_scheme scheme);

/* Frees a list of events. */
void wh_event_free_all(struct wh_event *list);

/* Starts the delivery thread; call once, after sign_init().  Returns false when it failed. */
bool webhooks_start(void);

/*
 * Stops the delivery thread and frees whatever is queued or recorded.  Call after
 * mock_shutting_down() turned true, so a delivery in progress is cut short.
 */
void webhooks_stop(void);

/* Forgets the queued events and timers and the delivery records (POST /_reset). */
void webhooks_reset(void);

/*
 * Queues a list of events for the delivery thread, taking ownership.  Each is delivered
 * delay_ms after now, and events due at the same time go in the order they were queued.
 */
void webhooks_enqueue(struct wh_event *list);

/*
 * Delivers a list of events now, on the calling thread, in order, taking ownership.  Stores
 * the HTTP status of each delivery (0 when none came back) into statuses, up to max of them,
 * and returns how many deliveries were made.
 */
size_t webhooks_deliver_now(struct wh_event *list, int *statuses, size_t max);

/*
 * Calls fire(arg) from the delivery thread ms milliseconds from now, unless a reset or a
 * shutdown comes first.  arg is copied (WH_TASK_ID_MAX bytes at most).  Returns false when
 * the queue is full or memory ran out.
 */
bool webhooks_after(unsigned int ms, void (*fire)(const char *arg), const char *arg);

/* GET /_webhooks[?task_id=ID]: {"deliveries": [...], "count": N, "pending": M}. */
enum MHD_Result webhooks_handle_log(struct mock_request *req);

/* GET /_webhook_keys: {"ed25519_public_key": "<base64>", "keys": [JWK]}. */
enum MHD_Result webhooks_handle_keys(struct mock_request *req);

#endif
