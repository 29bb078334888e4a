/*
 * idemgate-mock: per-key state of providers with native idempotency keys.
 *
 * A provider like Higgsfield or Argil remembers each Idempotency-Key it has seen: a second
 * request with a known key gets the original response back instead of a new paid task,
 * and a request whose key is still being processed is refused.  Keys are scoped by the
 * personality that saw them, so two routes never share a key.  The map is process-wide
 * and guarded by its own mutex.
 */
#ifndef IDEMGATE_MOCK_IDEMKEYS_H
#define IDEMGATE_MOCK_IDEMKEYS_H

#include <stdint.h>

/* The state a key was found in by idemkeys_claim(). */
enum idem_claim {
    IDEM_NEW,       /* unseen: the caller now owns the key and must complete or release it */
    IDEM_IN_FLIGHT, /* another request owns the key and has not answered yet */
    IDEM_DONE,      /* answered before: the stored response is handed back */
    IDEM_ERROR,     /* memory ran out */
};

/*
 * Looks key up within scope and, when it is unseen, marks it in flight for the caller and
 * stores a claim token in *token.  For IDEM_DONE, *body receives a heap copy of the stored
 * response body (the caller frees it) and *status its HTTP status.
 */
enum idem_claim idemkeys_claim(const char *scope, const char *key, uint64_t *token, char **body,
                               unsigned int *status);

/*
 * Stores the response of the claim identified by token, so later requests with the same
 * key are replayed.  Does nothing when the key was reset or reclaimed in the meantime.
 */
void idemkeys_complete(uint64_t token, const char *scope, const char *key, const char *body,
                       unsigned int status);

/*
 * Forgets the claim identified by token, because no task was created and a retry with the
 * same key should create one.  Does nothing when the key was reset or reclaimed.
 */
void idemkeys_release(uint64_t token, const char *scope, const char *key);

/* Forgets every key. */
void idemkeys_reset(void);

#endif
