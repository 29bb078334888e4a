/*
 * idemgate-mock: per-key state of providers with native idempotency keys (see idemkeys.h).
 *
 * The map is a fixed array of buckets with chaining; tests use at most a few thousand keys,
 * so the chains stay short without resizing.
 */
#include "idemkeys.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define BUCKETS 4096u

/* One remembered key. */
struct idem_entry {
    char *scope;
    char *key;
    uint64_t token;
    bool done;
    char *body; /* the stored response body once done */
    unsigned int status;
    struct idem_entry *next;
};

static pthread_mutex_t idem_lock = PTHREAD_MUTEX_INITIALIZER;
static struct idem_entry *buckets[BUCKETS];
static uint64_t next_token = 1;

/* Returns the bucket index of (scope, key), using 64-bit FNV-1a over both strings. */
static size_t bucket_of(const char *scope, const char *key)
{
    uint64_t h = 1469598103934665603ULL;

    for (const char *p = scope; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    /* A separator keeps ("ab", "c") and ("a", "bc") apart. */
    h = (h ^ 0xffu) * 1099511628211ULL;
    for (const char *p = key; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    return (size_t)(h % BUCKETS);
}

/*
 * Returns the address of the link that points at the entry for (scope, key), or at the
 * terminating NULL of its chain when there is none.  The caller holds idem_lock.
 */
static struct idem_entry **find_link(const char *scope, const char *key)
{
    struct idem_entry **link = &buckets[bucket_of(scope, key)];

    while (*link && (strcmp((*link)->scope, scope) != 0 || strcmp((*link)->key, key) != 0))
        link = &(*link)->next;
    return link;
}

/* Frees one entry and its strings. */
static void free_entry(struct idem_entry *e)
{
    free(e->scope);
    free(e->key);
    free(e->body);
    free(e);
}

/*
 * Looks key up within scope and, when it is unseen, marks it in flight for the caller and
 * stores a claim token in *token.  For IDEM_DONE, *body receives a heap copy of the stored
 * response body (the caller frees it) and *status its HTTP status.
 */
enum idem_claim idemkeys_claim(const char *scope, const char *key, uint64_t *token, char **body,
                               unsigned int *status)
{
    struct idem_entry **link;
    struct idem_entry *e;
    enum idem_claim result;

    pthread_mutex_lock(&idem_lock);
    link = find_link(scope, key);
    e = *link;
    if (e && !e->done) {
        result = IDEM_IN_FLIGHT;
    } else if (e) {
        *body = strdup(e->body);
        *status = e->status;
        result = *body ? IDEM_DONE : IDEM_ERROR;
    } else {
        e = calloc(1, sizeof(*e));
        if (e)
            e->scope = strdup(scope);
        if (e)
            e->key = strdup(key);
        if (e == NULL || e->scope == NULL || e->key == NULL) {
            if (e)
                free_entry(e);
            result = IDEM_ERROR;
        } else {
            e->token = next_token++;
            *token = e->token;
            *link = e;
            result = IDEM_NEW;
        }
    }
    pthread_mutex_unlock(&idem_lock);
    return result;
}

/*
 * Stores the response of the claim identified by token, so later requests with the same
 * key are replayed.  Does nothing when the key was reset or reclaimed in the meantime.
 */
void idemkeys_complete(uint64_t token, const char *scope, const char *key, const char *body,
                       unsigned int status)
{
    struct idem_entry **link;
    struct idem_entry *e, *dropped = NULL;
    char *copy = strdup(body);

    pthread_mutex_lock(&idem_lock);
    link = find_link(scope, key);
    e = *link;
    if (e && e->token == token && !e->done) {
        if (copy) {
            e->body = copy;
            e->status = status;
            e->done = true;
            copy = NULL;
        } else {
            /* Without a stored body there is nothing to replay, so the key is forgotten. */
            *link = e->next;
            dropped = e;
        }
    }
    pthread_mutex_unlock(&idem_lock);
    if (dropped)
        free_entry(dropped);
    free(copy);
}

/*
 * Forgets the claim identified by token, because no task was created and a retry with the
 * same key should create one.  Does nothing when the key was reset or reclaimed.
 */
void idemkeys_release(uint64_t token, const char *scope, const char *key)
{
    struct idem_entry **link;
    struct idem_entry *e = NULL;

    pthread_mutex_lock(&idem_lock);
    link = find_link(scope, key);
    if (*link && (*link)->token == token && !(*link)->done) {
        e = *link;
        *link = e->next;
    }
    pthread_mutex_unlock(&idem_lock);
    if (e)
        free_entry(e);
}

/* Forgets every key. */
void idemkeys_reset(void)
{
    pthread_mutex_lock(&idem_lock);
    for (size_t i = 0; i < BUCKETS; i++) {
        struct idem_entry *e = buckets[i];

        buckets[i] = NULL;
        while (e) {
            struct idem_entry *next = e->next;

            free_entry(e);
            e = next;
        }
    }
    pthread_mutex_unlock(&idem_lock);
}
