/*
 * idemgate-mock: provider personalities and the create pipeline they share.
 *
 * A personality is one row of the table in providers.c: the create route it serves, its
 * task lookup and list routes, whether it honours Idempotency-Key natively, and how it
 * renders a successful create.  Every create goes through the same pipeline: read the
 * controls, record the create in the ledger, note the task it made, wait, then deliver
 * the reply normally or through a fault.
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
    const char *path;          /* the POST route of its create */
    const char *lookup_prefix; /* GET <lookup_prefix>{client_ref}: one task (tasks.h) */
    const char *list_path;     /* GET <list_path>?since=&until=&limit=: recent tasks */
    /* True for providers that replay a response when an Idempotency-Key repeats. */
    bool native_idempotency;
    /*
     * Builds the JSON body of a successful create that the ledger numbered seq, which made
     * the task "task_<seq>", or returns NULL when memory ran out.
     */
    cJSON *(*render)(const struct create_input *in, unsigned long seq);
};

/*
 * Handles req when it is for a route of a personality (a create, a task lookup or a task
 * list) and stores libmicrohttpd's verdict in *ret.  Returns false, leaving req alone,
 * when no personality serves the request's method and path.
 */
bool providers_route(struct mock_request *req, enum MHD_Result *ret);

#endif
