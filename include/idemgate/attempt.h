#ifndef IDEMGATE_ATTEMPT_H
#define IDEMGATE_ATTEMPT_H

#include "idemgate/config.h"
#include "idemgate/engine.h"
#include "idemgate/lease.h"
#include "idemgate/upstream.h"

/* One create attempt of a claimed operation (state `sending`, lease held; or a born reservation,
 * c->born, moved to `sending` here first by lease_begin_send, and not sent when that refuses):
 * build the request from the row and the provider's settings, send it once, classify the
 * outcome, decide the next state, and record both under the lease (a fenced write is dropped and
 * logged). Shared by the dispatcher (prepared → sending) and the reconciler (unknown → sending, a
 * resend under the same provider idempotency key). claimed_mono is when the lease was granted,
 * by clock_mono(). The call itself runs on the call engine (engine.h), so the attempt is made
 * in steps: attempt_begin does what comes before the call (on a born reservation,
 * lease_begin_send) and takes the claim (c is left empty) into *out; -1 when nothing is to be
 * sent (the outcome, if any, is written; c is the caller's to free). attempt_xfer builds the
 * call's transfer (engine.h); -1 with *res holding the evidence of a call that could not be
 * built. attempt_end records the outcome in res (taking it) at t1 (wall clock) and frees the
 * attempt; it may run on another thread than attempt_begin, with another connection. */
struct attempt;
__attribute__((warn_unused_result)) int attempt_begin(const struct cfg *cfg, struct db *db,
                                                      struct store_claim *c, double claimed_mono,
                                                      struct attempt **out);
__attribute__((warn_unused_result)) int attempt_xfer(struct attempt *a, struct up_xfer **x,
                                                     struct up_response *res);
void attempt_end(struct attempt *a, struct db *db, struct up_response *res, double t1);
/* attempt_end in two halves, so that many results share one commit (store_finish_many):
 * attempt_outcome classifies and decides res (taken) at t1 — tripping the provider's breaker
 * first when the outcome says so, with db — and returns the result to write (valid until
 * attempt_recorded); attempt_recorded counts and logs what the write did (e: the store's answer,
 * applied: not fenced) and frees the attempt. */
const struct store_finish *attempt_outcome(struct attempt *a, struct db *db,
                                           struct up_response *res, double t1);
void attempt_recorded(struct attempt *a, int e, int applied);
/* attempt_outcome in steps, for the call engine, so that the credential probe a refusal asks for
 * is a call like any other: attempt_classify classifies and decides res (taken) at t1, and
 * returns 1 when the provider's probe is due; then attempt_probe_xfer gives its transfer (NULL:
 * nothing to send, its class is known) and attempt_probed records its answer (taken).
 * attempt_decided trips the breaker when due (probing now, blocking, if nobody did) and returns
 * the result to write. */
int attempt_classify(struct attempt *a, struct up_response *res, double t1);
struct up_xfer *attempt_probe_xfer(struct attempt *a);
void attempt_probed(struct attempt *a, struct up_response *res);
const struct store_finish *attempt_decided(struct attempt *a, struct db *db);
/* On a writer thread, once a create's call ended: attempt_classify of res (taken) at t1, then —
 * when the outcome asks the provider's probe about the credential — the probe submitted to e,
 * returning NULL: probe_done(arg, res) runs when it ended, calls attempt_probed and hands the
 * attempt back to a writer, which calls attempt_ready again (res and t1 are then ignored).
 * Otherwise the result to write (attempt_decided). Nothing heavy runs on an engine thread. */
const struct store_finish *attempt_ready(struct attempt *a, struct db *db, struct eng *e,
                                         struct up_response *res, double t1,
                                         eng_done_fn probe_done, void *arg);
/* The statement that starts a born reservation's send (lease_begin_send), for n of them in one
 * commit: begun[i] says whether cs[i] is now `sending` (it is then a claim like any other, for
 * attempt_begin); those not begun were given back or left to end with their reservation, as
 * attempt_begin does for one. Returns the batch's store answer (informational). */
int attempt_begin_born_many(const struct cfg *cfg, struct db *db, struct store_claim *const *cs,
                            size_t n, int *begun);
const struct cfg_provider *attempt_provider(const struct attempt *a);
const char *attempt_job_id(const struct attempt *a);
/* Gives up an attempt before its call (nothing was sent): the row goes back to `prepared` for
 * any replica, with why as its last error; the attempt is freed. */
void attempt_abandon(struct attempt *a, struct db *db, const char *why);

/* 1 when url is on the same scheme, host and port as base (see prov_same_origin). */
int attempt_same_origin(const char *url, const char *base);

/* 1 when a reconcile strategy finds the task by the client reference sent with the create
 * (get_by_client_id, list_match): such a create never leaves without its reference. */
int attempt_needs_client_ref(const char *strategy);
/* The same for a strategy already parsed. */
int attempt_strategy_needs_client_ref(enum cfg_reconcile strategy);

/* ---- Reading a provider's answer to a create (pure but for a log line; fuzzed) ---- */

/* The server's wish for a delay, in any of its forms: retry-after-ms, Retry-After (seconds or
 * HTTP-date, the date read against the provider's own Date header when it sent one), or the
 * provider's words in the body (the profile's body hint). Headers come from res->headers_json;
 * -1 when it expressed none. */
long long attempt_server_hint_ms(const struct cfg_provider *p, const struct up_response *res);

/* What a whole answer says about results: outputs received (-1: not counted) and usage. */
struct attempt_results {
    int received; /* -1: not counted */
    char *usage;  /* JSON text or NULL; owned by the caller */
    /* An event stream (the profile's stream format, a text/event-stream answer) that lacks its
     * terminal event or carried an error event: generated and paid for, not complete. */
    int stream_cut;
    int stream_whole; /* an event stream read to its terminal event (cls_evidence) */
    /* The status the stream's first error event stands for when no output came before it
     * (cls_evidence.stream_error_status), and its type ("" when none). */
    int stream_error_status;
    char stream_error_type[48];
    char stream_id[128]; /* the generation's id the stream gave (sse_verdict.id), or "" */
    int stream_output;   /* the stream carried output (sse_verdict.output): generated, billed */
    /* A synchronous profile reads its answer (outputs or usage) and this whole answer is not
     * JSON, or empty: an egress proxy's page, a corrupted reply — not the provider's result. */
    int unreadable;
};

/* 1 when res is an event stream of p's stream format: p has one and the answer's Content-Type
 * is text/event-stream. */
int attempt_is_stream(const struct cfg_provider *p, const struct up_response *res);

/* Reads outputs received (the profile's outputs_received path) and usage from res's body into
 * *out; a truncated or non-JSON body counts nothing. An event stream (attempt_is_stream) is read
 * by sse.h: its usage as the provider reports it, and whether it was cut. The caller frees
 * out->usage. */
void attempt_count_results(const struct cfg_provider *p, const struct up_response *res,
                           struct attempt_results *out);

/* What a whole 2xx from an async provider says: the task id and a poll URL (when given), read
 * exactly, and whether its status is one the profile lists as accepted. The decision is
 * pol_decide's. */
struct attempt_task {
    int status_listed;
    char *remote_id; /* owned, or NULL */
    char *poll_url;  /* owned, or NULL: only on the provider's own origin */
};

/* Reads an async create's answer into *t (zeroed by the caller); the caller frees remote_id and
 * poll_url. A poll URL off the provider's base URL is refused (logged). */
void attempt_read_task(const struct cfg_provider *p, const struct up_response *res,
                       struct attempt_task *t);

struct rq;
/* Where the notes of a create in flight go (the owner's queue, written by a thread with a
 * connection): the id a stream names, kept on the row while the call goes on, for a provider
 * that keeps its generations (reconcile.task.path); a stream's record in batches; and the
 * renewals of the create's lease (attempt_tick). Call before attempt_xfer; without it, the id
 * and the record are kept only with the result, and the lease is never renewed (the call is
 * limited to the profile's total_ms, inside the lease). */
void attempt_note_ids(struct attempt *a, struct rq *notes);
/* The tick of a create submitted with attempt_note_ids (engine.h, eng_submit_held_ticked; arg:
 * the attempt): once half its lease is left, a renewal is queued for the writer; once the lease
 * as last written is over (renewals refused or failing), 1: the call is cut — never running on
 * while another replica may take its row. A create may so run up to the profile's
 * create_total_ms. */
int attempt_tick(void *arg);

/* A synchronous provider's whole 2xx answer whose status (reconcile.found_status) says its task
 * is still in progress — OpenAI Responses with "background": true answers `queued` — is followed
 * as an async task is; one that says failed or cancelled is failed. *t gets its id
 * (reconcile.found_status.id) when it has one, and the status is returned (TS_QUEUED,
 * TS_RUNNING, TS_FAILED or TS_CANCELED); -1 for any other answer, or profile. */
int attempt_read_deferred(const struct cfg_provider *p, const struct up_response *res,
                          struct attempt_task *t);

#endif
