#ifndef IDEMGATE_ARCHPLAN_H
#define IDEMGATE_ARCHPLAN_H

#include <cjson/cJSON.h>
#include <stddef.h>

struct cfg_provider;

/* Output archival decisions (issue 13 §1), as pure functions: which outputs a completed
 * operation has and where each one's bytes come from, and what follows a failed copy. The
 * profile's "archive" member they read is archprof.h's; archive.c does the I/O around them. */

enum ap_kind { AP_URL = 0, AP_B64, AP_ENDPOINT };
const char *ap_kind_name(enum ap_kind k);
int ap_kind_parse(const char *s); /* -1 when unknown */

/* One output of a completed operation. */
struct ap_output {
    enum ap_kind kind;
    char *url;          /* AP_URL, AP_ENDPOINT */
    double expires_at;  /* Unix seconds; 0: unknown (no expiry known) */
    const char *b64;    /* AP_B64: the base64 text, pointing into the parsed body */
    char *content_type; /* as the result declares it, or NULL */
};

struct ap_plan {
    struct ap_output *out;
    size_t n;
    cJSON *doc; /* the parsed result the b64 pointers point into */
};
void ap_plan_fini(struct ap_plan *pl);

/* The outputs of a completed operation of provider p, from what the operation stored: the
 * provider's final answer (body, len), the outputs the poller recorded (outputs_json: an array of
 * {"url", "expires_at"} or {"kind": "b64"}, or NULL for a synchronous provider), its remote id
 * (a content endpoint's {id}). now is the Unix time for a synchronous provider's URL lifetime
 * (profile result.url_ttl_seconds). Returns 0 (possibly with no output), or -1 when out of
 * memory. */
int ap_plan_outputs(const struct cfg_provider *p, const char *body, size_t len,
                    const char *outputs_json, const char *remote_id, double now,
                    struct ap_plan *pl);

/* What follows a failed copy. */
enum ap_verdict { AP_RETRY = 0, AP_FAILED, AP_EXPIRED };
#define AP_MAX_ATTEMPTS_NO_EXPIRY 10
/* attempts: copies tried so far, this one included; now (when the copy failed) and expires_at
 * in Unix seconds (expires_at 0: unknown); permanent: the failure cannot change by trying again
 * (a refused address or host, an oversized output, a redirect off the origin); store: the
 * archive store failed, not the copy (a bucket's 5xx, a full disk) — then bytes that never
 * expire (base64 kept in the result) are tried again however often: a store's outage of a few
 * minutes failed them for good after AP_MAX_ATTEMPTS_NO_EXPIRY. rand01 in [0, 1) for the jitter.
 * On AP_RETRY, *delay_ms is the wait before the next copy: full-jitter exponential (1 s base,
 * 60 s cap) — with an expiry, the last try is made before it. */
/* The wait before a claim given back because the archive's own store could not take a copy
 * (its temporary file not opened: no GET made) is claimed again: 5–30 s, spread by rand01 in
 * [0, 1) — never an expiry or a failure of the output, never a busy loop. Pure. */
#define AP_STORE_RETRY_MIN_MS 5000LL
#define AP_STORE_RETRY_MAX_MS 30000LL
long long ap_store_retry_ms(double rand01);
/* Whether a claimed output whose expiry has passed is written `expired` without a try: not at
 * its first claim (attempts counts this one, and each earlier claim that reached the provider's
 * URL or whose holder died; a claim given back before any GET takes its count back). The
 * expiry is often the profile's estimate (result.url_ttl_seconds after the result), and a
 * backlog or an outage that delayed the first claim past it proves nothing of the URL: one GET
 * tells (its failure is then `expired`). Pure. */
int ap_expired_untried(int attempts, double now, double expires_at);

enum ap_verdict ap_after_failure(int attempts, double now, double expires_at, int permanent,
                                 int store, double rand01, long long *delay_ms);

/* How many outputs one claim may take: the least of the copies archive_max_inflight still
 * allows, the engine's free slots and the batch; 0 when any is spent (nothing is claimed). */
int ap_claim_room(int inflight_left, int engine_room, int batch);

/* A claim's rows share its lease, which runs out at lease_end (seconds, the clock of now).
 * ap_copy_timeout_ms: a row's copy (or a redirect's hop) may take configured_ms, never past
 * margin_s before lease_end; 0 when less than AP_COPY_MIN_MS (or configured_ms, if smaller) is
 * left (the row waits for a later claim, under a lease of its own). */
#define AP_COPY_MIN_MS 500
long ap_copy_timeout_ms(long configured_ms, double now, double lease_end, double margin_s);

/* Whether a thread's buffered copy ends must be written now: the oldest was buffered at since
 * and has waited max_wait_s, or the first of their leases to run out (first_end) is within
 * margin_s of now. */
int ap_ends_due(double now, double since, double first_end, double max_wait_s, double margin_s);

#endif
