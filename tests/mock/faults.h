/*
 * idemgate-mock: behaviour controls, the fault table and the fault script queue.
 *
 * A create's behaviour (delay, error status, fault, partial output count, Retry-After, and
 * for asynchronous providers the task's course and webhooks) is a struct mock_controls.  Each field
 * is taken from the highest-priority source that sets it: the next entry of the script queue (POST
 * /_script), then the request body's "_mock" object, then X-Mock-* request headers.  A delay nobody
 * sets falls back to the fault's own default and then to --delay-ms.  New control fields are rows
 * of the field table in faults.c; new faults are rows of its fault table.
 */
#ifndef IDEMGATE_MOCK_FAULTS_H
#define IDEMGATE_MOCK_FAULTS_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "mock.h"
#include "reply.h"

/*
 * How a decided reply reaches (or fails to reach) the client.  A fault is pure data plus a
 * delivery function, so adding one means adding a row to the table in faults.c.
 */
struct mock_fault {
    const char *name;
    /* The delay applied when no source sets delay_ms, so "slow_headers" alone is slow. */
    unsigned int default_delay_ms;
    /* False when the client never receives a status line; the ledger then records null. */
    bool sends_status;
    /* Delivers r through this fault.  r stays owned by the caller. */
    enum MHD_Result (*deliver)(struct mock_request *req, const struct mock_reply *r);
};

/* Bits of mock_controls.set, one per field. */
enum {
    CTRL_DELAY = 1u << 0,
    CTRL_STATUS = 1u << 1,
    CTRL_FAULT = 1u << 2,
    CTRL_N_OUT = 1u << 3,
    CTRL_RETRY_AFTER = 1u << 4,
    CTRL_POLLS = 1u << 5,
    CTRL_OUTCOME = 1u << 6,
    CTRL_ERROR = 1u << 7,
    CTRL_OUTPUTS = 1u << 8,
    CTRL_WEBHOOK = 1u << 9,
    CTRL_TASK_MADE = 1u << 10,
    CTRL_VISIBLE_AFTER = 1u << 11,
    CTRL_PAD = 1u << 12,
    CTRL_ID_NUMERIC = 1u << 13,
    CTRL_ID_MISSING = 1u << 14,
    CTRL_POLL_DELAY = 1u << 15,
    CTRL_CANCEL_FAILS = 1u << 16,
    CTRL_FILTERED = 1u << 17,
    CTRL_READS_FAIL = 1u << 18,
};

/* The controls that only asynchronous personalities understand. */
#define CTRL_ASYNC                                                                                 \
    (CTRL_POLLS | CTRL_OUTCOME | CTRL_ERROR | CTRL_OUTPUTS | CTRL_WEBHOOK | CTRL_ID_NUMERIC |      \
     CTRL_ID_MISSING | CTRL_POLL_DELAY | CTRL_CANCEL_FAILS | CTRL_FILTERED | CTRL_READS_FAIL)

/* Longest failure message a task can carry, including the terminating NUL. */
#define MOCK_ERROR_MAX 1024

/* Largest pad_bytes: 64 MiB. */
#define MOCK_PAD_MAX (64u * 1024u * 1024u)

/* Longest webhook URL a control can name, including the terminating NUL. */
#define MOCK_URL_MAX 512

/* How an asynchronous task's webhooks are delivered (the "_mock.webhook" object). */
struct mock_webhook_controls {
    char url[MOCK_URL_MAX];        /* where to deliver when the provider's own field is absent */
    unsigned int duplicates;       /* extra copies of every event */
    unsigned int delay_ms;         /* the final event waits this long */
    bool has_auto_complete;        /* auto_complete_ms was given */
    unsigned int auto_complete_ms; /* the task finishes on its own this long after the create */
    bool early;                    /* the final event is delivered before the create is answered */
    bool reorder;                  /* a stale intermediate event follows the final one */
    bool bad_signature;            /* every delivery carries a wrong signature */
};

/* The behaviour of one create; a field is meaningful only when its bit is in set. */
struct mock_controls {
    unsigned int set;
    unsigned int delay_ms;
    unsigned int status;
    const struct mock_fault *fault;
    unsigned int n_out;
    char retry_after[MOCK_RETRY_AFTER_MAX];
    /* Asynchronous tasks only: status reads before the task ends, and how it ends. */
    unsigned int polls;
    /* Each status read's answer waits this long after the task's state was read. */
    unsigned int poll_delay_ms;
    /* The first cancels of the task answer 503 and cancel nothing. */
    unsigned int cancel_fails;
    unsigned int reads_fail_after_cancel;
    bool fail;
    char error[MOCK_ERROR_MAX];
    unsigned int outputs;
    /* Outputs the provider withheld (Veo's raiMediaFilteredCount), besides those it returns. */
    unsigned int filtered;
    struct mock_webhook_controls webhook;
    /* With a status of 300 or more, the task is made anyway (a CDN error after the origin). */
    bool task_made;
    /* The task is hidden from lookups, lists and task reads this long after the create. */
    unsigned int visible_after_ms;
    /* A 2xx create body gains "pad": a string of this many "x" (a very large answer). */
    unsigned int pad_bytes;
    /* keyed-async only: the task id is a JSON integer above 2^53; the create answer has no id. */
    bool id_numeric;
    bool id_missing;
};

/* Longest error message the control parsers produce, including the terminating NUL. */
#define FAULTS_ERR_MAX 160

/* Returns the fault called name, or NULL when there is none. */
const struct mock_fault *faults_find(const char *name);

/*
 * Parses a "_mock"-style JSON object into *out.  Returns false and describes the problem
 * in err (FAULTS_ERR_MAX bytes) when a key is unknown or a value is out of range.
 */
bool faults_parse_object(const cJSON *obj, struct mock_controls *out, char *err);

/*
 * Parses the X-Mock-* headers of the request into *out.  Returns false and describes the
 * problem in err (FAULTS_ERR_MAX bytes) when a value is invalid.
 */
bool faults_parse_headers(struct MHD_Connection *conn, struct mock_controls *out, char *err);

/* Copies into dst every field that src sets and dst does not. */
void faults_merge(struct mock_controls *dst, const struct mock_controls *src);

/*
 * Appends the entries of a {"faults": [...]} document to the script queue, all or none.
 * Stores the number appended in *queued and the queue length afterwards in *pending.
 * Returns false and describes the problem in err (FAULTS_ERR_MAX bytes) on a bad document.
 */
bool faults_script_append(const cJSON *doc, size_t *queued, size_t *pending, char *err);

/*
 * Removes the oldest script entry into *out.  Returns false, leaving *out alone, when the
 * queue is empty.
 */
bool faults_script_pop(struct mock_controls *out);

/* Empties the script queue. */
void faults_script_reset(void);

#endif
