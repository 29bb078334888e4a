#include "idemgate/archready.h"

#include "idemgate/blobstore.h"
#include "idemgate/log.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* The process's one cached verdict (one archive per process, as in archive.c). */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static long long checked_ms = -1; /* monotonic time of the last probe; -1: none yet */
static enum archready_state verdict = ARCHREADY_NOT_USED;
static char reason[256];

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Every provider's outputs are archived (its "archive" member has defaults), so a replica with
 * archive workers and a provider writes copies. */
int archready_used(const struct cfg *cfg)
{
    return cfg->archive_workers > 0 && cfg->n_providers > 0;
}

int archready_stale(long long age_ms)
{
    return age_ms < 0 || age_ms >= ARCHREADY_TTL_MS;
}

/* Probes the store once; the caller holds mu. */
static void probe_locked(const struct cfg *cfg)
{
    char why[256] = "out of memory";
    struct blob_store *b = blob_open(cfg);
    int ok = b && blob_probe(b, why, sizeof(why)) == 0;
    enum archready_state v = ok ? ARCHREADY_WRITABLE : ARCHREADY_UNWRITABLE;
    if (v != verdict || (!ok && strcmp(why, reason) != 0)) {
        if (ok)
            LOG(LOG_INFO, "archive_writable", LS("backend", cfg->archive_backend));
        else
            LOG(LOG_ERROR, "archive_unwritable", LS("backend", cfg->archive_backend),
                LS("error", why));
    }
    verdict = v;
    snprintf(reason, sizeof(reason), "%s", ok ? "" : why);
    blob_close(b);
}

enum archready_state archready_check(const struct cfg *cfg, char *why, size_t whylen)
{
    if (!archready_used(cfg))
        return ARCHREADY_NOT_USED;
    pthread_mutex_lock(&mu);
    long long now = now_ms();
    if (archready_stale(checked_ms < 0 ? -1 : now - checked_ms)) {
        probe_locked(cfg);
        checked_ms = now_ms();
    }
    enum archready_state v = verdict;
    if (why && whylen)
        snprintf(why, whylen, "%s", reason);
    pthread_mutex_unlock(&mu);
    return v;
}
