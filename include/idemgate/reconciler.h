#ifndef IDEMGATE_RECONCILER_H
#define IDEMGATE_RECONCILER_H

#include "idemgate/config.h"
#include "idemgate/states.h"
#include "idemgate/wpool.h"

/* Reconciler workers: unknown → accepted/completed (found), prepared (proven absent), sending
 * (a resend under the same provider idempotency key), or review (an operator decides). Nothing
 * is ever resent without proof, except under a provider idempotency key. */

/* Starts cfg->reconcile_workers threads, each with one connection: they claim, decide, and write
 * what was found; the calls (lookups, list pages, task reads, resends) run on the call engine e.
 * NULL on failure. */
struct reconciler;
struct eng;
struct reconciler *recon_start(const struct cfg *cfg, struct eng *e);
/* Stops claiming; the calls in flight still end and are written (recon_stop, after eng_stop). */
void recon_quiesce(struct reconciler *r);
/* Writes what is left, stops the threads and frees r (r may be NULL). */
void recon_stop(struct reconciler *r);

/* What a reconcile look concluded, before it is written. Pure. */
enum recon_verdict {
    RV_FOUND,   /* exactly one task carries our reference */
    RV_ABSENT,  /* proven absent: safe to send */
    RV_LATER,   /* cannot tell yet: look again */
    RV_REVIEW,  /* ambiguous for good: an operator decides */
};

/* list_match: matches = tasks carrying our reference over every page (-1 when a page failed or
 * the pages could not all be read); window_closed = the resend window (from the first send) is
 * over; grace_passed = the provider's absent_grace_ms has passed since the last ambiguous send.
 * Absence needs the grace period (a task may be committed after our timeout), and a resend
 * after it needs the window still open; a task is adopted whenever it is found. */
enum recon_verdict recon_list_verdict(int matches, int window_closed, int grace_passed);
/* Whether a search under the profile stamped `current` (profile.h, profile_stamp) can prove
 * absent a job whose intake was stamped `recorded`: only under the same digest of where the
 * client reference goes and how the search reads it — under another, the search looks where
 * the create put nothing, and its empty answer sent the create again. A job recorded before
 * stamps (no '#') is judged as before. Pure. */
int recon_same_reference(const char *recorded, const char *current);
/* After a list page was read: whether to read the next. total: the matches counted so far (-1:
 * a page failed); has_cursor: the page named a next one; pages_read: pages read so far;
 * past_lease: the next page could end after the lease. Pure. */
enum recon_page_step {
    RPS_DONE,     /* every page read: total is what the search proves */
    RPS_NEXT,     /* read the next page */
    RPS_UNPROVEN, /* stop: nothing is proven (a page failed, too many pages, no time left) */
};
enum recon_page_step recon_next_page(int total, int has_cursor, int pages_read, int max_pages,
                                     int past_lease);
/* What a whole search proves, once every page was read: total, the matches counted (-1: nothing
 * proven); items, the list items seen on every page; readable, those whose match path read as a
 * string. No match among items none of which shows the match path (a list view without the
 * member, a reference sent in a header only) proves nothing: -1, never absence. Pure. */
int recon_search_proof(int total, int items, int readable);

/* When to look again after a search proved nothing yet: not before the provider's absent grace
 * has passed since the last ambiguous send (no search can prove absence before it), and never
 * sooner than the profile's interval. Pure. */
long recon_later_ms(long interval_ms, long grace_ms, long long since_ambiguous_ms);

/* get_by_client_id: what the lookup's body proves (recon_lookup_proves): 1 found, 0 none, -1
 * nothing (no answer, any other status, a 2xx that is not our task, a 404 that is not the
 * provider's own "no such task"). Pure. */
int recon_lookup_proves(const struct cfg_provider *p, int http_status, const char *body,
                        size_t body_len, const char *client_ref);

/* get_by_client_id: the verdict of what the lookup proved (1, 0 or -1 as above). Pure. */
enum recon_verdict recon_lookup_verdict(int proves, int window_closed, int grace_passed);

/* What the reconciler does with an unknown operation it claimed. Pure. */
enum recon_plan {
    RP_LOOK,   /* search the provider (lookup or list) */
    RP_RESEND, /* a transport retry under the same provider key */
    RP_ADOPT,  /* read the task a verified webhook named by our client reference */
    RP_WAIT,   /* nothing to do before the window closes */
    RP_REVIEW, /* hand it to an operator */
};
struct recon_facts {
    enum cfg_reconcile strategy;
    int can_look;         /* the profile has the lookup / list it needs */
    int cancel_requested; /* the client cancelled: nothing is ever sent again */
    int window_closed;
    int budget_left;      /* transport attempts and deadline allow another resend */
    int webhook_hint;     /* a verified webhook named a task by our reference */
};
enum recon_plan recon_plan(const struct recon_facts *f);

/* The state a found task leads to (a found task is the truth, whatever the client asked
 * meanwhile): async with a usable id → accepted (polled to its end; after a cancel the poller
 * first cancels it at the provider); async without an id → review; sync → completed when its
 * answer holds the result where the profile says (result_read), else review. Never failed: a
 * task exists. */
enum op_state recon_found_state(int async, int has_id, int result_read);

/* What is written when a task named by its id (a verified webhook's hint, the id a cut stream
 * named, an operator's `found`) was not adopted. Pure. */
enum recon_adopt_miss {
    RAM_NAMED_UNREADABLE, /* the operator's id could not be read: review, the operator again */
    RAM_STREAM_ID_UNREAD, /* the cut stream's id could not be read: looked again, or review */
    RAM_NOT_OURS,         /* read, and it does not carry our reference: the hint dropped */
    /* Not readable by its id, and the profile's strategy can look (lookup, list): the hint is
     * dropped for the strategy, and the job is marked ambiguous as of now — the provider has
     * signed that a task exists, and the absent grace counts from here: a search that lags the
     * provider's own webhook is not taken for proof of absence in the meantime (it was counted
     * from the first send, usually long past, and the job was sent again). Its verdict's
     * outcome (RECON_SIGNED_UNREAD) is a sight of the task: an `absent` is refused after it. */
    RAM_SEARCH_FROM_NOW,
    /* Not readable by its id, and nothing will look for it: strategy none, or the recovery
     * window closed (no search runs in review). The hint kept, review at once. */
    RAM_HINT_REVIEW,
    RAM_HINT_KEPT,   /* the read failed: the hint kept for the next look */
};
enum recon_adopt_miss recon_adopt_miss(int operator_found, int has_hint, int answered,
                                       int readable_by_id, int strategy_none, int window_closed);

#endif
