#ifndef IDEMGATE_JOBCACHE_H
#define IDEMGATE_JOBCACHE_H

#include <stddef.h>

/* A bounded in-memory cache of terminal jobs, for replays and GETs. A terminal job's state and
 * result never change, so a cached answer is the database's answer (a completed job's archive
 * view still changes while its outputs are copied: such a view is kept for a few hundred
 * milliseconds only, see reply_cache_terminal); entries also expire after a short time, which
 * bounds how long a revoked token or an expired key can still be answered from memory. A miss
 * always reads the database. Direct-mapped, one lock per slot; safe from any thread. */

struct jobcache_entry {
    char fingerprint[65]; /* of the operation (for replays: 422 when it differs) */
    char *job_json;       /* the job as GET /v1/jobs/{id} shows it */
    char job_id[32];
    char state[16];
    char provider[64], route[160]; /* of the operation: what a 422 says differed */
    int resp_status;      /* the provider's, for Prefer: wait */
    char content_type[128];
    char *resp_body;
    size_t resp_body_len;
};

/* slots == 0 disables the cache. max_bytes bounds the bytes of the entries held (their job
 * documents and answers; 0: no bound): an entry larger than a sixteenth of it is never held, and
 * one that would pass the bound is held only once expired entries are freed to make room (else
 * it is not held: its reads go to the database). */
#define JOBCACHE_ENTRY_SHARE 16
int jobcache_init(size_t slots, int ttl_ms, size_t max_bytes);
/* Bytes of the entries held. */
size_t jobcache_bytes(void);
void jobcache_fini(void);

/* kind distinguishes lookups by idempotency key ('k') from lookups by job id ('j'). On a hit,
 * fills *out with copies (free with jobcache_entry_fini) and returns 1. */
int jobcache_get(char kind, const char *token_hash, const char *name, struct jobcache_entry *out);
/* Stores a copy of e (the job must be terminal) for the cache's time to live, or for max_ms
 * when that is shorter (0: no shorter bound). */
void jobcache_put(char kind, const char *token_hash, const char *name,
                  const struct jobcache_entry *e, int max_ms);
void jobcache_entry_fini(struct jobcache_entry *e);

#endif
