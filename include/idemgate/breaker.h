#ifndef IDEMGATE_BREAKER_H
#define IDEMGATE_BREAKER_H

#include "idemgate/classify.h"
#include "idemgate/profile.h"
#include "idemgate/upstream.h"

/* A provider's credential breaker: tripped for every tenant only on evidence about the
 * credential that the profile's probe does not refute (issue 21 §5; the decision is
 * cls_trip_confirmed's, pure), and cleared by the same probe once it answers 2xx (the reaper's
 * loop) or by an operator's reset. */

struct db;

/* One authenticated GET of the profile's probe.path with the profile's credential, given at most
 * budget_ms (the profile's timeouts, shortened to fit): its class. CLS_PROBE_NONE when the
 * profile has no probe; CLS_PROBE_NO_ANSWER when less than 100 ms is left or no status came. */
enum cls_probe breaker_probe(const struct cfg_provider *p, long budget_ms);
/* The same probe as a transfer for the call engine (engine.h), whose answer breaker_probe_class
 * reads; or NULL when there is nothing to send, *known then being the class (CLS_PROBE_NONE, or
 * CLS_PROBE_NO_ANSWER when it cannot be made in time). */
struct up_xfer *breaker_probe_xfer(const struct cfg_provider *p, long budget_ms,
                                   enum cls_probe *known);
/* The class of a probe's answer. */
enum cls_probe breaker_probe_class(const struct cfg_provider *p, const struct up_response *res);

/* After a create (operation job_id) was refused with evidence about the credential
 * (CLS_REJECTED_ACCOUNT, HTTP http_status) and the probe made since answered probe: trips the
 * provider
 * when cls_trip_confirmed says so (logged once, provider_tripped). Returns 1 when the credential
 * is to be taken as refused (tripped, or the trip could not be recorded), 0 when the probe
 * refuted the evidence: then only this job fails, counted as idemgate_trips_refuted_total. */
int breaker_trip_confirmed(const struct cfg_provider *p, struct db *db, const char *job_id,
                           int http_status, enum cls_probe probe);

#endif
