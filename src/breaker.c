#include "idemgate/breaker.h"

#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/provider.h"
#include "idemgate/store.h"

#include <stdio.h>
#include <stdlib.h>

/* Below this, a probe could not even connect: it is not made (and proves nothing). */
#define PROBE_MIN_MS 100

struct up_xfer *breaker_probe_xfer(const struct cfg_provider *p, long budget_ms,
                                   enum cls_probe *known)
{
    struct up_xfer *x = NULL;
    *known = CLS_PROBE_NO_ANSWER;
    if (!p->probe_path)
        *known = CLS_PROBE_NONE;
    if (!p->probe_path || budget_ms < PROBE_MIN_MS)
        return NULL;
    /* The profile's timeouts, shortened to the budget: the transfer takes them from q. */
    struct cfg_provider q = *p;
    if (q.total_timeout_ms > budget_ms)
        q.total_timeout_ms = budget_ms;
    if (q.connect_timeout_ms > q.total_timeout_ms)
        q.connect_timeout_ms = q.total_timeout_ms;
    char *url = prov_url(p, p->probe_path, NULL, NULL, "probe");
    if (!url)
        return NULL;
    struct up_response res;
    struct prov_call call = {.method = "GET", .url = url, .credential = p->credential};
    if (prov_xfer_new(&q, &call, &x, &res) < 0)
        up_response_fini(&res);
    free(url);
    return x;
}

enum cls_probe breaker_probe_class(const struct cfg_provider *p, const struct up_response *res)
{
    return res->curl_code == 0 && res->http_status > 0
               ? cls_probe_class(res->http_status, p->trip_statuses, p->n_trip_statuses)
               : CLS_PROBE_NO_ANSWER;
}

enum cls_probe breaker_probe(const struct cfg_provider *p, long budget_ms)
{
    enum cls_probe c;
    struct up_xfer *x = breaker_probe_xfer(p, budget_ms, &c);
    if (!x)
        return c;
    struct up_response res;
    (void)up_xfer_perform(x, &res);
    c = breaker_probe_class(p, &res);
    up_response_fini(&res);
    return c;
}

int breaker_trip_confirmed(const struct cfg_provider *p, struct db *db, const char *job_id,
                           int http_status, enum cls_probe probe)
{
    if (!cls_trip_confirmed(CLS_REJECTED_ACCOUNT, probe)) {
        metrics_safety(MS_TRIP_REFUTED);
        LOG(LOG_WARN, "provider_trip_refuted", LS("provider", p->name),
            LI("http_status", http_status), LS("job_id", job_id),
            LS("note", "the probe answered 2xx: only this job failed"));
        return 0;
    }
    char reason[128];
    snprintf(reason, sizeof(reason), "credential refused: HTTP %d%s", http_status,
             probe == CLS_PROBE_REFUSED ? " (confirmed by the probe)" : "");
    if (store_breaker_trip(db, p->name, http_status, reason, job_id) == STORE_OK)
        LOG(LOG_ERROR, "provider_tripped", LS("provider", p->name), LI("http_status", http_status),
            LS("job_id", job_id),
            LS("probe", probe == CLS_PROBE_NONE      ? "none"
                        : probe == CLS_PROBE_REFUSED ? "refused"
                                                     : "no_answer"));
    return 1;
}
