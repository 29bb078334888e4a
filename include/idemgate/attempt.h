#ifndef IDEMGATE_ATTEMPT_H
#define IDEMGATE_ATTEMPT_H

#include "idemgate/config.h"
#include "idemgate/lease.h"
#include "idemgate/upstream.h"

/* One create attempt of a claimed operation (state `sending`, lease held): build the request
 * from the row and the provider's settings, send it once, classify the outcome, decide the next
 * state, and record both under the lease (a fenced write is dropped and logged). Shared by the
 * dispatcher (prepared → sending) and the reconciler (unknown → sending, a resend under the
 * same provider idempotency key). claimed_mono is when the lease was granted, by
 * CLOCK_MONOTONIC. */
void attempt_create(const struct cfg *cfg, struct db *db, const struct store_claim *c,
                    double claimed_mono);

/* 1 when url is on the same scheme, host and port as base (see prov_same_origin). */
int attempt_same_origin(const char *url, const char *base);

/* 1 when a reconcile strategy finds the task by the client reference sent with the create
 * (get_by_client_id, list_match): such a create never leaves without its reference. */
int attempt_needs_client_ref(const char *strategy);
/* The same for a strategy already parsed. */
int attempt_strategy_needs_client_ref(enum cfg_reconcile strategy);

#endif
