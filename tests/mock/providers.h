/*
 * idemgate-mock: provider personalities and the create pipeline they share.
 *
 * A personality is one row of the table in providers.c: the create route it serves, whether
 * it honours Idempotency-Key natively, and how it renders a successful create.  Every
 * create goes through the same pipeline: read the controls, record the create in the
 * ledger, wait, then deliver the reply normally or through a fault.
 */
#ifndef IDEMGATE_MOCK_PROVIDERS_H
#define IDEMGATE_MOCK_PROVIDERS_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "mock.h"

/* What a create request asked for, as far as rendering its answer is concerned. */
struct create_input {
    size_t prompt_len;  /* bytes of "prompt", 0 when absent */
    unsigned int n;     /* requested outputs, clamped to 1..10 */
    unsigned int n_out; /* outputs actually returned (n unless n_out overrides it) */
};

/* One simulated provider. */
struct mock_personality {
    const char *name;
    const char *path; /* the POST route of its create */
    /* True for providers that replay a response when an Idempotency-Key repeats. */
    bool native_idempotency;
    /*
     * Builds the JSON body of a successful create that the ledger numbered seq, or returns
     * NULL when memory ran out.
     */
    cJSON *(*render)(const struct create_input *in, unsigned long seq);
};

/* Returns the personality whose create route is path, or NULL when there is none. */
const struct mock_personality *providers_lookup(const char *path);

/*
 * Handles a fully received create request for personality p: records it in the ledger and
 * answers it as the controls say.  Returns MHD_NO when the connection must be closed.
 */
enum MHD_Result providers_handle_create(struct mock_request *req, const struct mock_personality *p);

#endif
