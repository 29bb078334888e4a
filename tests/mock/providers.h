/*
 * idemgate-mock: provider personalities and the create pipeline they share.
 *
 * A personality is one row of the table in providers.c: its routes (method and path
 * pattern, see route.h), the status of a successful create, a header its creates require,
 * whether it honours Idempotency-Key natively, and either how it renders a synchronous
 * create or, for an asynchronous job API, its shapes (async.h).  Every create goes through
 * the same pipeline: read the controls, record the create in the ledger, note the task it
 * made, wait, then deliver the reply normally or through a fault.
 */
#ifndef IDEMGATE_MOCK_PROVIDERS_H
#define IDEMGATE_MOCK_PROVIDERS_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "mock.h"

struct async_kind;

/* What a create request asked for, as far as rendering its answer is concerned. */
struct create_input {
    size_t prompt_len;  /* bytes of "prompt", 0 when absent */
    unsigned int n;     /* requested outputs, clamped to 1..10 */
    unsigned int n_out; /* outputs actually returned (n unless n_out overrides it) */
    bool b64;           /* "response_format": "b64_json": the bytes inline, not a URL */
};

/* What a route of a personality does; each kind has one handler in providers.c. */
enum route_kind {
    ROUTE_CREATE, /* a create, recorded in the ledger */
    ROUTE_LOOKUP, /* a synchronous provider's task by client reference; pattern has {ref*} */
    ROUTE_LIST,   /* recent tasks, newest first */
    ROUTE_TASK,   /* a synchronous provider's task by its id; pattern has {id} */
    ROUTE_POLL,   /* an asynchronous task's status; a status read that advances the task */
    ROUTE_RESULT, /* an asynchronous task's result or content */
    ROUTE_CANCEL, /* an asynchronous task's cancel */
};

/* One route: a method and a path pattern (route.h); a NULL pattern ends the list. */
struct provider_route {
    enum route_kind kind;
    const char *method;
    const char *pattern;
};

/* Most routes one personality serves. */
#define MOCK_MAX_ROUTES 8

/* One simulated provider. */
struct mock_personality {
    const char *name;
    struct provider_route routes[MOCK_MAX_ROUTES];
    unsigned int create_status; /* the status of a successful create */
    /* A create without this header is refused with 400 and makes no task; NULL: none. */
    const char *required_header;
    /* True for providers that replay a response when an Idempotency-Key repeats. */
    bool native_idempotency;
    /*
     * True when a key stays in flight until the answer is written (or a hang ends), so a
     * duplicate during a hang gets 409; false when it settles before a fault is delivered.
     */
    bool in_flight_until_answered;
    /*
     * Synchronous providers: builds the JSON body of a successful create whose task is
     * "task_<stem>" (stem is the ledger's sequence number, or "s<n>" for a seeded task), or
     * returns NULL when memory ran out.
     */
    cJSON *(*render)(const struct create_input *in, const char *stem);
    /* Asynchronous providers: their task shapes and behaviour; NULL for synchronous ones. */
    const struct async_kind *async;
};

/*
 * Handles req when it is for a route of a personality and stores libmicrohttpd's verdict
 * in *ret.  Returns false, leaving req alone, when no personality serves the request's
 * method and path.
 */
bool providers_route(struct mock_request *req, enum MHD_Result *ret);

/* Returns the personality called name, or NULL when there is none. */
const struct mock_personality *providers_find(const char *name);

/* Lower-case hex SHA-256 of data[0..len) into hex (65 bytes); "" when the digest fails. */
void mock_sha256_hex(const char *data, size_t len, char hex[65]);

#endif
