/*
 * idemgate-mock: the tasks of asynchronous job APIs (create -> task id -> poll -> result),
 * their course, cancels and webhooks.
 *
 * A task walks its provider's status labels as status reads ("polls") go by: the create
 * answers the first label, the last status read before the end shows the last one, and
 * the read numbered "polls" (the _mock control, default 2) ends the task as "outcome"
 * says.  Timing is by poll count, so tests are deterministic; a task can also end on its
 * own after _mock.webhook.auto_complete_ms, and POST /_webhooks/send can move it on.  A
 * state, once final, never changes.
 *
 * The provider-specific parts (labels, JSON shapes, webhook scheme) are a struct
 * async_kind per provider, in shapes.c.  The store is process-wide, guarded by one mutex,
 * and holds the newest ASYNC_MAX_TASKS tasks.  Task ids come from a counter that /_reset
 * does not restart, so an id is never reused within one mock process.
 */
#ifndef IDEMGATE_MOCK_ASYNC_H
#define IDEMGATE_MOCK_ASYNC_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "faults.h"
#include "mock.h"
#include "providers.h"
#include "reply.h"
#include "route.h"
#include "webhooks.h"

/* Most tasks kept; the oldest is forgotten when another is made. */
#define ASYNC_MAX_TASKS 100000u

/* Bytes a task id may take, including the NUL (a Vertex operation name is the longest). */
#define ASYNC_ID_MAX WH_TASK_ID_MAX

/* Where a task is: not finished (at a step of its labels) or in one of the final states. */
enum async_state {
    AS_PENDING,
    AS_SUCCEEDED,
    AS_FAILED,
    AS_CANCELED,
};

/* One status label before the end, and whether it means the work is running. */
struct async_step {
    const char *label;
    bool running; /* false: still queued */
};

/* A state to render: the task's own, or another one for a stale or forged webhook. */
struct async_view {
    enum async_state state;
    unsigned int step; /* meaningful while state is AS_PENDING */
};

/* Which events a task's webhooks report. */
enum {
    EV_CREATED = 1u << 0, /* the first label, sent when the task is made */
    EV_STEP = 1u << 1,    /* every later label before the end */
    EV_FINAL = 1u << 2,   /* the final state */
};

/* One task.  Renderers read it under the store's lock and must not keep pointers into it. */
struct async_task {
    char id[ASYNC_ID_MAX]; /* the provider's id (Vertex: the full operation name) */
    char short_id[48];     /* the id without a Vertex operation's resource prefix */
    const struct mock_personality *p;
    const struct async_kind *kind;
    unsigned long seq;                  /* the ledger entry of the create */
    unsigned long long number;          /* the process-wide task counter */
    double created, started, completed; /* Unix seconds; 0 while not yet */
    double visible_at; /* status reads and lists show the task from this Unix time on */
    char *client_ref;  /* NULL when the create carried none */
    char *scope;       /* fal's model, Replicate's owner/name, Vertex's resource; or NULL */
    char *echo;        /* JSON text echoed back (Replicate's input, Luma's request), or NULL */
    char ext[8];       /* the extension of output files: ".png" or ".mp4" */
    unsigned int polls_needed, polls, cancels, outputs;
    unsigned int filtered;      /* outputs withheld by a safety filter (Vertex renders them) */
    unsigned int poll_delay_ms; /* a status read's answer waits this long (after the read) */
    unsigned int cancel_fails;  /* cancels still to answer 503 without cancelling */
    unsigned int reads_fail;    /* status reads still to answer 503 once cancelled */
    bool fail;
    char *error;
    enum async_state state;
    unsigned int step;
    bool deleted;    /* Luma: a DELETE removed the generation */
    bool id_numeric; /* the id is decimal digits, rendered as a JSON integer (keyed-async) */
    bool id_missing; /* the create's answer leaves the id out (keyed-async) */
    /* Webhooks. */
    char *webhook_url; /* NULL: no webhooks */
    unsigned int events;
    struct mock_webhook_controls wh;
    struct async_task *hash_next;
};

/* What is provider-specific about an asynchronous personality. */
struct async_kind {
    /* Ids: prefix + counter ("video_12"); NULL makes uuid-like ids. */
    const char *id_prefix;
    /* True when the id_numeric and id_missing controls apply (keyed-async). */
    bool id_controls;
    /* True when the id is "<scope>/operations/<prefix><n>" (Vertex long-running operations). */
    bool operation_names;
    const struct async_step *steps; /* the labels before the end; steps[0] is the create's */
    size_t n_steps;
    const char *succeeded, *failed, *canceled; /* the final labels */
    /* The scope a task belongs to, built from route captures ("{owner}/{name}"); NULL: none. */
    const char *scope_template;
    /* The scope keeps its first scope_segments "/"-separated segments (fal's app id: a model's
     * subpath, "fal-ai/flux/dev", is not part of its request URLs); 0: all of it. */
    unsigned int scope_segments;
    /* Status reads take the task id from this body member (Vertex); NULL: the {id} capture. */
    const char *id_body_member;
    /* Extension of output files; NULL: ".mp4" when the create path ends in "video". */
    const char *output_ext;
    /* Echoed input: NULL none, "" the whole create body without "_mock", else a member. */
    const char *echo_member;
    /* Webhooks: whether the provider sends any, how they are signed, where the URL is. */
    bool webhooks;
    enum wh_scheme scheme;
    const char *webhook_member; /* a body member holding the URL, or NULL */
    const char *webhook_query;  /* a query parameter holding the URL, or NULL */
    unsigned int events;        /* the events sent by default */
    bool events_filter;         /* reads Replicate's "webhook_events_filter" */
    bool cancel_deletes;        /* a cancel removes the task (Luma's DELETE) */
    /* A header every status read answers with (OpenAI's poll hint), or NULL. */
    const char *poll_hint_header, *poll_hint_value;
    /* The body of a successful create. */
    cJSON *(*render_create)(const struct async_task *t);
    /*
     * The task object in view v: what status reads answer (with the mock's counters added),
     * a list item, and the body of most webhooks.
     */
    cJSON *(*render_object)(const struct async_task *t, struct async_view v);
    /* The body of a webhook reporting view v. */
    cJSON *(*render_webhook)(const struct async_task *t, struct async_view v, const char *event_id);
    /* The answer of a result route (status, body, type); NULL when there is none. */
    void (*render_result)(const struct async_task *t, struct mock_reply *r);
    /* The answer of a cancel; was_final tells whether the task had already ended. */
    void (*render_cancel)(const struct async_task *t, bool was_final, struct mock_reply *r);
    /*
     * Wraps the task objects of a list page (takes items over), with "has_more" and
     * "next_cursor" (NULL on the last page: null, has_more false); NULL when there is no list.
     */
    cJSON *(*render_list)(cJSON *items, const char *next_cursor);
    /* The provider's error body; code is a short machine word such as "not_found". */
    void (*render_error)(struct mock_reply *r, unsigned int status, const char *code,
                         const char *message);
};

/* Everything a create hands to async_create(). */
struct async_create_args {
    const struct mock_personality *p;
    struct mock_request *req;
    const cJSON *doc;            /* the create body, a JSON object */
    const struct route_match *m; /* the create route's captures */
    const struct mock_controls *ctrl;
    const char *client_ref; /* NULL when none */
    unsigned long seq;      /* the ledger entry */
    bool keep;              /* false: render the answer but make no task */
};

/*
 * Makes the task of an asynchronous create and returns the create's body (NULL when memory
 * ran out).  With keep, the task is stored, task_id (ASYNC_ID_MAX) receives its id,
 * *events the webhooks the creation itself sends (the caller queues or holds them), and
 * the auto-complete timer starts.  Without keep, task_id is empty and nothing is stored.
 */
cJSON *async_create(const struct async_create_args *a, char *task_id, struct wh_event **events);

/*
 * Ends the task now (as its outcome says) and delivers, on the calling thread, the held
 * creation events followed by the events of its ending; takes ownership of held.  For a
 * create with "_mock.webhook.early", before its answer is written.
 */
void async_finish_early(const char *task_id, struct wh_event *held);

/*
 * Makes a task of personality p that no create made (POST /_tasks/seed): created now, with
 * the client reference client_ref, the default course, no scope and no webhooks.  Writes
 * its id into task_id (ASYNC_ID_MAX).  Returns false when memory ran out.
 */
bool async_seed(const struct mock_personality *p, const char *client_ref, char *task_id);

/*
 * Returns an error text when controls ask for something the personality cannot do (a
 * webhook URL for a provider without webhooks), else NULL.
 */
const char *async_check_controls(const struct mock_personality *p, const struct mock_controls *c);

/* Status read: counts a poll, advances the task and answers its object. */
enum MHD_Result async_handle_poll(struct mock_request *req, const struct mock_personality *p,
                                  const struct route_match *m);

/* Result route: the task's result or content, without counting a poll. */
enum MHD_Result async_handle_result(struct mock_request *req, const struct mock_personality *p,
                                    const struct route_match *m);

/* Cancel route: counts a cancel and cancels the task unless it has ended. */
enum MHD_Result async_handle_cancel(struct mock_request *req, const struct mock_personality *p,
                                    const struct route_match *m);

/*
 * List route: one page of the personality's tasks, newest first (/_config "list" settings
 * apply), with "has_more" and "next_cursor".
 */
enum MHD_Result async_handle_list(struct mock_request *req, const struct mock_personality *p,
                                  const struct route_match *m);

/* GET /_tasks and GET /_tasks/{id}: the mock's own view of asynchronous tasks. */
enum MHD_Result async_handle_tasks(struct mock_request *req);

/* POST /_webhooks/send: delivers a task's event now, synchronously. */
enum MHD_Result async_handle_send(struct mock_request *req);

/* Forgets every task (POST /_reset); the id counter keeps counting. */
void async_reset(void);

/* ---- Helpers for the renderers in shapes.c ---- */

/* Returns the task's current view. */
struct async_view async_current(const struct async_task *t);

/* Returns the provider's label of view v. */
const char *async_label(const struct async_task *t, struct async_view v);

/* Returns true when view v is queued (not running, not final). */
bool async_is_queued(const struct async_task *t, struct async_view v);

/* Returns how far the work is in view v, 0..100. */
unsigned int async_progress(const struct async_task *t, struct async_view v);

/* Writes the URL of output file i ("<base>/files/<id>-<i><ext>") into out. */
void async_output_url(const struct async_task *t, unsigned int i, char *out, size_t size);

/* Writes Unix time t as RFC 3339 UTC with milliseconds into out (at least 32 bytes). */
void async_rfc3339(double t, char *out, size_t size);

/*
 * Returns the task object of t in its current state with the mock's counters "polls" and
 * "cancels" added, as status reads and lists answer it; NULL when memory ran out.
 */
cJSON *async_counted_object(const struct async_task *t);

/* Returns the task's echoed input as a new cJSON value, or a JSON null. */
cJSON *async_echo(const struct async_task *t);

#endif
