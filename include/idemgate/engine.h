#ifndef IDEMGATE_ENGINE_H
#define IDEMGATE_ENGINE_H

#include "idemgate/upstream.h"

/* The call engine: every provider call a dispatcher makes runs here, thousands at once on a few
 * threads, none of them holding a database connection. Each engine thread owns one libcurl multi
 * handle driven by its socket and timer callbacks on an epoll loop (STYLE.md); a transfer and its
 * easy handle belong to that thread from submission to completion.
 *
 * Room is counted before anything is claimed: eng_acquire takes one slot of the engine's
 * max_inflight and of the provider's own limit, and the caller either submits the call on it or
 * gives it back. So a claimed operation never waits in a queue with its lease running, and the
 * number of calls in flight is a setting, not a thread count.
 *
 * ENG_ROOM_THEN_TAKE: the pools whose calls are not creates (the poller, the reconciler, the
 * archive) look at eng_room before they claim and take the slot only once they claimed something
 * (eng_acquire_more): their idle claims, many a second, never hold a slot that a create's claim
 * then finds taken. They may pass max_inflight by what one claim takes per claiming thread: one
 * call (the poller, the reconciler), one batch of outputs (the archive, at most 8).
 *
 * Completion: done(arg, res) runs on the engine thread exactly once per submitted transfer, with
 * the call's evidence (res is the callee's to keep or release with up_response_fini). It must not
 * block: it hands the result to whoever writes it. Stopping lets every call in flight end (each
 * has its total timeout), so none is dropped. */

struct eng;

/* done's contract above. */
typedef void (*eng_done_fn)(void *arg, struct up_response *res);

/* Starts threads (>= 1) engine threads; max_inflight bounds the calls in flight or reserved in
 * all, per_provider[i] (0: no limit of its own) the calls of provider slot i in [0, n_providers).
 * per_provider is copied. NULL when it cannot start (nothing is left running). */
__attribute__((warn_unused_result)) struct eng *eng_start(int threads, int max_inflight,
                                                          const int *per_provider, int n_providers);
/* Lets every call in flight end (its done runs), then stops the threads. A call submitted later
 * is made on the submitting thread (blocking), so that none is ever dropped. e may be NULL. */
void eng_stop(struct eng *e);
/* Frees a stopped engine (e may be NULL). */
void eng_free(struct eng *e);

/* Takes one slot for a call to provider slot prov (-1: counted against max_inflight only).
 * Returns 1 when taken, 0 when the engine or the provider is full. */
int eng_acquire(struct eng *e, int prov);
/* Counts a slot taken for -1 against provider slot prov as well (unbounded: the provider was
 * known only after the claim). eng_release(e, prov) then gives back both. */
void eng_assign(struct eng *e, int prov);
/* Takes a slot whatever the room, for a call that follows one of the same job that just ended
 * (a poll's status read after its cancel): a chain keeps its place. */
void eng_acquire_more(struct eng *e);
/* Gives back a slot taken and not submitted on. */
void eng_release(struct eng *e, int prov);
/* fn(arg) runs whenever a slot is given back, from any thread (a call's end, a claim that found
 * nothing): it must only wake the pool, whose claim found the engine full, to claim again. Call
 * it at the pool's start; eng_room_off(e, arg) before the pool is freed (fn is then never called
 * again with arg). */
void eng_on_room(struct eng *e, void (*fn)(void *arg), void *arg);
void eng_room_off(struct eng *e, void *arg);
/* 1 when the provider's own limit is reached (its calls should not be claimed now). */
int eng_provider_full(const struct eng *e, int prov);
/* Free slots in the engine as a whole. */
int eng_room(const struct eng *e);
/* Calls in flight (submitted, done not yet run). */
int eng_inflight(const struct eng *e);

/* Submits transfer x (taking ownership) on a slot taken for prov. done(arg, res) is called once
 * it ended, from an engine thread; the slot is given back just before. */
void eng_submit(struct eng *e, int prov, struct up_xfer *x, eng_done_fn done, void *arg);
/* The same for a create: its slot stays taken after done, until the caller recorded the outcome
 * and calls eng_release(e, prov). So no create of the provider is claimed on the slot of one
 * whose refusal (a tripped credential) is not written yet. */
void eng_submit_held(struct eng *e, int prov, struct up_xfer *x, eng_done_fn done, void *arg);
/* A call's tick: runs on its engine thread about every ENG_TICK_MS while the call is in flight,
 * never after its done; it must not block. Returns 1 to cut the call there and then: its done
 * runs with CURLE_OPERATION_TIMEDOUT and the evidence of how far it got (its connection is
 * closed). */
typedef int (*eng_tick_fn)(void *arg);
#define ENG_TICK_MS 500
/* eng_submit_held with a tick (tick_arg: its argument). */
void eng_submit_held_ticked(struct eng *e, int prov, struct up_xfer *x, eng_done_fn done,
                            void *arg, eng_tick_fn tick, void *tick_arg);

/* A transfer that is not a provider call of upstream.h (an archive copy, with its own write and
 * socket callbacks): h is a configured CURL easy handle, still the caller's. done(arg,
 * curl_code) runs once it ended, from an engine thread (the slot given back first); the caller
 * then reads h's info and cleans it up. Its CURLOPT_PRIVATE is the engine's. */
typedef void (*eng_easy_done_fn)(void *arg, int curl_code);
/* With a tick (tick_arg: its argument), as eng_submit_held_ticked's: one that returns 1 cuts the
 * transfer, whose done then runs with CURLE_OPERATION_TIMEDOUT. */
void eng_submit_easy_ticked(struct eng *e, int prov, void *h, eng_easy_done_fn done, void *arg,
                            eng_tick_fn tick, void *tick_arg);

#endif
