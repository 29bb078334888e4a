#ifndef IDEMGATE_STATES_H
#define IDEMGATE_STATES_H

/* The operation state machine (DESIGN.md §2). Pure: names and allowed transitions. */

enum op_state {
    ST_PREPARED = 0, /* committed, nothing sent (or proven not sent) */
    ST_SENDING,      /* a worker holds the lease and may have sent */
    ST_ACCEPTED,     /* the provider's task id is known */
    ST_UNKNOWN,      /* ambiguous: reconcile before any resend */
    ST_REVIEW,       /* an operator decides */
    ST_COMPLETED,    /* terminal: the provider's result is stored */
    ST_FAILED,       /* terminal: an explicit rejection or task failure; no task exists */
    ST_CANCELED,     /* terminal: a task existed and the provider ended it at our request */
    ST__COUNT
};

const char *st_name(enum op_state s);
/* Returns the state named s, or -1. */
int st_parse(const char *s);
/* 1 for completed, failed and canceled, which never change again. */
int st_is_terminal(enum op_state s);
/* 1 when from → to is an edge of the state machine. A state never moves backwards to one with
 * less evidence (nothing leaves a terminal state; sending or unknown never return to prepared
 * except on proof that nothing was sent). */
/* 1 for a state a new row may be recorded in: prepared, or sending (born claimed: the edge
 * prepared → sending taken inside the commit that records the row). */
int st_is_initial(enum op_state s);
int st_can_transition(enum op_state from, enum op_state to);

/* An operator's decision on a job in review (POST /v1/jobs/{id}/resolve and the CLI alike). */
enum st_resolution {
    RES_FOUND = 0, /* the task exists at the provider: its remote id is given */
    RES_ABSENT,    /* nothing was made: it may be sent again */
    RES_ABANDON,   /* give up: failed */
};
/* Returns the resolution named s ("found", "absent", "abandon"), or -1. */
int st_resolution_parse(const char *s);
/* The state a resolution leads to. A task found at an async provider still has to be polled for
 * its result (accepted); a synchronous one whose task the profile can read by id is read first
 * (unknown, adopted by the reconciler with its answer as the result), else completed on the
 * operator's word; a cancelled operation is never sent again (absent → failed). */
enum op_state st_resolve_target(enum st_resolution r, int async, int readable,
                                int cancel_requested);
/* Whether an `absent` is refused because the gateway has seen the job's task (task_known: the
 * row holds a remote id — a task found whose status or result could not be read, the id a cut
 * stream named — or a verified webhook's hint it could not read). To `prepared` it would pay a
 * second task, the one known overwritten by the new create's; to `failed` (a cancelled job) it
 * would end failed at cost 0 a job whose task exists and may be billed. Only forced — the
 * admin's word that the id is not this job's, e.g. one an operator named by mistake — does it
 * go through. (next: the state the resolution leads to; refused whatever it is.) */
int st_resend_refused(enum st_resolution r, enum op_state next, int task_known, int forced);

/* How a task seen without its id was seen, for the refusal's words: seen is the store's
 * (RECON_SAW_TASK outcome, or SEEN_CREATE_ANSWERED and the status). */
const char *st_seen_by(const char *seen);

/* The outcomes of a reconcile verdict that saw the provider's task without an id to adopt it by:
 * found by a lookup or a list, its id or its result unreadable; several tasks carrying our
 * reference; or a verified webhook naming a task of this job that the profile cannot read by its
 * id, left to the strategy's search (reconciler.c, RAM_SEARCH_FROM_NOW). The job goes to
 * review; an `absent` would send it again and pay a second task, so a resolution refuses it as
 * it does for a known remote id (jobs.c, cli.c: the admin's force passes). RECON_SAW_TASK is
 * the same names as a text[] literal, for the store's read. */
#define RECON_FOUND_WITHOUT_ID "found_without_id"
#define RECON_FOUND_UNREADABLE "found_unreadable"
#define RECON_SEVERAL_MATCHES "several_matches"
#define RECON_SIGNED_UNREAD "signed_task_unread"
/* The same proof from the job's own create: the provider answered it 2xx (a task was made) and
 * the gateway could not read its id or its result (store.c, job_hint: this and the status). */
#define SEEN_CREATE_ANSWERED "create answered HTTP "
/* And from its stream: the record of a 2xx event stream kept on the row as it arrived
 * (attempt.c, keep_partial) with no answer written after it — the replica died mid-stream (the
 * reaper took the row), or its result could not be written: the provider was generating. */
#define SEEN_STREAM_BEGAN "a record of it kept while it ran" /* an SQL literal: no quote */
#define RECON_SAW_TASK                                                                             \
    "{" RECON_FOUND_WITHOUT_ID "," RECON_FOUND_UNREADABLE "," RECON_SEVERAL_MATCHES                \
    "," RECON_SIGNED_UNREAD "}"

#endif
