#include "idemgate/credwatch.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "idemgate/config.h"
#include "idemgate/log.h"
#include "idemgate/metrics.h"
#include "idemgate/provider.h"
#include "idemgate/secrets.h"

struct cw_slot {
    pthread_mutex_t mu;         /* one reader at a time; the others keep what was read */
    atomic_int verdict;         /* enum cw_verdict of the last read */
    _Atomic double read_ms;     /* when it was read; < 0: never */
};

struct credwatch {
    const struct cfg *cfg;
    size_t n;
    struct cw_slot slot[];
};

enum cw_verdict cw_judge(const char *credential_ref, const char *secret)
{
    if (!credential_ref || !*credential_ref)
        return CW_USABLE; /* nothing to send: nothing to lack */
    if (!secret)
        return CW_UNSET;
    return prov_secret_ok(secret) ? CW_USABLE : CW_CONTROL_CHARACTER;
}

const char *cw_reason(enum cw_verdict v)
{
    switch (v) {
    case CW_UNSET:
        return "the provider's credential is not set (its variable unset, its file unreadable "
               "or empty)";
    case CW_CONTROL_CHARACTER:
        return "the provider's credential holds a control character (a line end at its end?): "
               "nothing was sent; fix the secret";
    case CW_USABLE:
        break;
    }
    return NULL;
}

int cw_stale(double read_ms, double now_ms)
{
    return read_ms < 0 || now_ms - read_ms >= CW_RECHECK_MS || now_ms < read_ms;
}

struct credwatch *cw_new(const struct cfg *cfg)
{
    struct credwatch *w = calloc(1, sizeof(*w) + cfg->n_providers * sizeof(struct cw_slot));
    if (!w)
        return NULL;
    w->cfg = cfg;
    w->n = cfg->n_providers;
    for (size_t i = 0; i < w->n; i++) {
        pthread_mutex_init(&w->slot[i].mu, NULL);
        atomic_store(&w->slot[i].verdict, CW_USABLE);
        atomic_store(&w->slot[i].read_ms, -1.0);
    }
    return w;
}

void cw_free(struct credwatch *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n; i++)
        pthread_mutex_destroy(&w->slot[i].mu);
    free(w);
}

/* Reads slot i's credential and keeps the verdict; logs a change. Called under its lock. */
static void read_slot(struct credwatch *w, size_t i, double now_ms)
{
    const struct cfg_provider *p = &w->cfg->providers[i];
    char *secret = p->credential && *p->credential ? secret_get(p->credential) : NULL;
    enum cw_verdict v = cw_judge(p->credential, secret);
    secret_free(secret);
    int first = atomic_load(&w->slot[i].read_ms) < 0;
    enum cw_verdict was = (enum cw_verdict)atomic_exchange(&w->slot[i].verdict, (int)v);
    atomic_store(&w->slot[i].read_ms, now_ms);
    metrics_credential_unusable(p->name, v != CW_USABLE);
    if (v != CW_USABLE && (first || was != v))
        LOG(LOG_ERROR, "provider_credential_unusable", LS("provider", p->name),
            LS("credential", secret_name(p->credential)), LS("error", cw_reason(v)),
            LS("note", "its jobs are left prepared for replicas that can send them"));
    else if (v == CW_USABLE && !first && was != CW_USABLE)
        LOG(LOG_INFO, "provider_credential_usable", LS("provider", p->name),
            LS("credential", secret_name(p->credential)));
}

int cw_sendable(struct credwatch *w, int i, double now_ms)
{
    if (!w || i < 0 || (size_t)i >= w->n)
        return 1;
    struct cw_slot *s = &w->slot[i];
    if (cw_stale(atomic_load(&s->read_ms), now_ms) && pthread_mutex_trylock(&s->mu) == 0) {
        if (cw_stale(atomic_load(&s->read_ms), now_ms))
            read_slot(w, (size_t)i, now_ms);
        pthread_mutex_unlock(&s->mu);
    }
    /* Never read yet and another thread reading it now: sendable, as before this replica
     * looked (the send's own check refuses it). */
    return atomic_load(&s->verdict) == CW_USABLE;
}

void cw_recheck(struct credwatch *w, int i, double now_ms)
{
    if (!w || i < 0 || (size_t)i >= w->n)
        return;
    pthread_mutex_lock(&w->slot[i].mu);
    read_slot(w, (size_t)i, now_ms);
    pthread_mutex_unlock(&w->slot[i].mu);
}
