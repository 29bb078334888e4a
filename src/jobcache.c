#include "idemgate/jobcache.h"

#include "idemgate/crypto.h"

#include <pthread.h>
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

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int jobcache_init(size_t n, int ttl_ms)
{
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

void jobcache_fini(void)
{
    for (size_t i = 0; i < n_slots; i++) {
        jobcache_entry_fini(&slots[i].e);
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
    pthread_mutex_lock(&s->mu);
    if (s->expires_ms > now_ms() && memcmp(s->key, key, sizeof(key)) == 0)
        hit = copy_entry(out, &s->e) == 0;
    pthread_mutex_unlock(&s->mu);
    return hit;
}

void jobcache_put(char kind, const char *token_hash, const char *name,
                  const struct jobcache_entry *e, int max_ms)
{
    uint8_t key[CRYPTO_SHA256_LEN];
    struct slot *s = slot_for(kind, token_hash, name, key);
    struct jobcache_entry copy;
    if (!s || copy_entry(&copy, e) < 0)
        return;
    pthread_mutex_lock(&s->mu);
    jobcache_entry_fini(&s->e);
    s->e = copy;
    memcpy(s->key, key, sizeof(key));
    s->expires_ms = now_ms() + (max_ms > 0 && max_ms < ttl ? max_ms : ttl);
    pthread_mutex_unlock(&s->mu);
}
