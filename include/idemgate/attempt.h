#ifndef IDEMGATE_ATTEMPT_H
#define IDEMGATE_ATTEMPT_H

#include "idemgate/config.h"
#include "idemgate/store.h"
#include "idemgate/upstream.h"

/* One create attempt of a claimed operation (state `sending`, lease held): build the request
 * from the row and the provider's settings, send it once, classify the outcome, decide the next
 * state, and record both under the lease (a fenced write is dropped and logged). Shared by the
 * dispatcher (prepared → sending) and the reconciler (unknown → sending, a resend under the
 * same provider idempotency key). claimed_mono is when the lease was granted, by
 * CLOCK_MONOTONIC. */
void attempt_create(const struct cfg *cfg, struct db *db, const struct store_claim *c,
                    double claimed_mono);

/* A GET to the provider with its credential (reconcile lookups, lists, probes). url is
 * absolute. Fills res as up_call does; returns up_call's result, or -1 when the credential
 * variable is not set (res->error says so). */
int attempt_get(const struct cfg_provider *p, const char *credential, const char *url,
                struct up_response *res);

/* 1 when url is on the same scheme, host and port as base (a poll URL or result URL the
 * provider hands back must be, or it is not followed: no server-side request forgery). */
int attempt_same_origin(const char *url, const char *base);

double attempt_mono_now(void);
double attempt_wall_now(void);
/* A uniform random number in [0, 1). */
double attempt_rand01(void);

#endif
