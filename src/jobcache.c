#include "idemgate/jobcache.h"

#include "idemgate/crypto.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct slot {
    pthread_mutex_t mu;
    uint8_t key[CRYPTO_SHA256_LEN];
    long long expires_ms; /* 0: empty */
    struct jobcache_entry e;
};

static struct slot *slots;
static size_t n_slots;
static int ttl;
static size_t max_bytes;     /* 0: no byte bound */
static atomic_size_t used;   /* bytes of the entries held */
static atomic_llong swept_ms; /* when expired entries were last freed for room */
/* Room is looked for by freeing expired entries at most this often. */
#define SWEEP_EVERY_MS 100

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int jobcache_init(size_t n, int ttl_ms, size_t bytes)
{
    max_bytes = bytes;
    atomic_store(&used, 0);
    if (n == 0)
        return 0;
    slots = calloc(n, sizeof(*slots));
    if (!slots)
        return -1;
    for (size_t i = 0; i < n; i++)
        pthread_mutex_init(&slots[i].mu, NULL);
    n_slots = n;
    ttl = ttl_ms;
    return 0;
}

void jobcache_entry_fini(struct jobcache_entry *e)
{
    free(e->job_json);
    free(e->resp_body);
    memset(e, 0, sizeof(*e));
}

/* The bytes an entry holds. */
static size_t entry_bytes(const struct jobcache_entry *e)
{
    return (e->job_json ? strlen(e->job_json) + 1 : 0) + (e->resp_body ? e->resp_body_len + 1 : 0);
}

/* Empties a slot (its lock held). */
static void drop_locked(struct slot *s)
{
    if (s->expires_ms)
        atomic_fetch_sub(&used, entry_bytes(&s->e));
    jobcache_entry_fini(&s->e);
    s->expires_ms = 0;
}

size_t jobcache_bytes(void)
{
    return atomic_load(&used);
}

/* Frees every expired entry, at most every SWEEP_EVERY_MS (no slot lock held by the caller). */
static void sweep_expired(long long now)
{
    long long last = atomic_load(&swept_ms);
    if (now - last < SWEEP_EVERY_MS || !atomic_compare_exchange_strong(&swept_ms, &last, now))
        return;
    for (size_t i = 0; i < n_slots; i++) {
        pthread_mutex_lock(&slots[i].mu);
        if (slots[i].expires_ms && slots[i].expires_ms <= now)
            drop_locked(&slots[i]);
        pthread_mutex_unlock(&slots[i].mu);
    }
}

/* Counts b bytes as held when they fit the bound. 1: held; 0: they do not fit. */
static int reserve(size_t b)
{
    if (!max_bytes) {
        atomic_fetch_add(&used, b);
        return 1;
    }
    if (atomic_fetch_add(&used, b) + b <= max_bytes)
        return 1;
    atomic_fetch_sub(&used, b);
    return 0;
}

void jobcache_fini(void)
{
    for (size_t i = 0; i < n_slots; i++) {
        drop_locked(&slots[i]);
        pthread_mutex_destroy(&slots[i].mu);
    }
    free(slots);
    slots = NULL;
    n_slots = 0;
}

/* The slot key: a hash of kind, token hash and name, so entries of different tenants can never
 * answer for each other. */
static struct slot *slot_for(char kind, const char *token_hash, const char *name,
                             uint8_t key[CRYPTO_SHA256_LEN])
{
    struct crypto_sha256 h;
    if (!n_slots || crypto_sha256_begin(&h) < 0)
        return NULL;
    crypto_sha256_update(&h, &kind, 1);
    crypto_sha256_update(&h, token_hash, strlen(token_hash) + 1);
    crypto_sha256_update(&h, name, strlen(name));
    crypto_sha256_end(&h, key);
    uint64_t idx;
    memcpy(&idx, key, sizeof(idx));
    return &slots[idx % n_slots];
}

static int copy_entry(struct jobcache_entry *dst, const struct jobcache_entry *src)
{
    *dst = *src;
    dst->job_json = strdup(src->job_json ? src->job_json : "");
    dst->resp_body = NULL;
    if (src->resp_body) {
        dst->resp_body = malloc(src->resp_body_len + 1);
        if (dst->resp_body) {
            memcpy(dst->resp_body, src->resp_body, src->resp_body_len);
            dst->resp_body[src->resp_body_len] = '\0';
        }
    }
    if (!dst->job_json || (src->resp_body && !dst->resp_body)) {
        jobcache_entry_fini(dst);
        return -1;
    }
    return 0;
}

int jobcache_get(char kind, const char *token_hash, const char *name, struct jobcache_entry *out)
{
    uint8_t key[CRYPTO_SHA256_LEN];
    struct slot *s = slot_for(kind, token_hash, name, key);
    int hit = 0;
    if (!s)
        return 0;
    long long now = now_ms();
    pthread_mutex_lock(&s->mu);
    if (s->expires_ms && s->expires_ms <= now)
        drop_locked(s); /* its memory back at once */
    else if (s->expires_ms && memcmp(s->key, key, sizeof(key)) == 0)
        hit = copy_entry(out, &s->e) == 0;
    pthread_mutex_unlock(&s->mu);
    return hit;
}

void jobcache_put(char kind, const char *token_hash, const char *name,
                  const struct jobcache_entry *e, int max_ms)
{
    uint8_t key[CRYPTO_SHA256_LEN];
    struct slot *s = slot_for(kind, token_hash, name, key);
    if (!s)
        return;
    long long now = now_ms();
    if (max_bytes && entry_bytes(e) > max_bytes / JOBCACHE_ENTRY_SHARE) {
        /* Never held; an earlier view of the same name is no longer answered either. */
        pthread_mutex_lock(&s->mu);
        if (s->expires_ms && memcmp(s->key, key, sizeof(key)) == 0)
            drop_locked(s);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    struct jobcache_entry copy;
    if (copy_entry(&copy, e) < 0)
        return;
    size_t b = entry_bytes(&copy);
    pthread_mutex_lock(&s->mu);
    drop_locked(s); /* replaced (or evicted: one entry per slot) */
    int fits = reserve(b);
    pthread_mutex_unlock(&s->mu);
    if (!fits) {
        sweep_expired(now);
        fits = reserve(b);
    }
    if (!fits) {
        jobcache_entry_fini(&copy);
        return;
    }
    pthread_mutex_lock(&s->mu);
    drop_locked(s); /* whatever another thread put here meanwhile */
    s->e = copy;
    memcpy(s->key, key, sizeof(key));
    s->expires_ms = now + (max_ms > 0 && max_ms < ttl ? max_ms : ttl);
    pthread_mutex_unlock(&s->mu);
}
