#ifndef IDEMGATE_REQLIMIT_H
#define IDEMGATE_REQLIMIT_H

#include <stddef.h>

/* What the HTTP transport can hold of a request target, decided before libmicrohttpd parses it.
 *
 * libmicrohttpd keeps a connection's request line, headers and one record per query parameter
 * in one memory pool per connection (RL_POOL_BYTES, set by http_server.c). libmicrohttpd 0.9.75
 * answers a request line or a header section that does not fit with 414/431 by itself, but a
 * query whose parameters do not fit (≈ 480 of them in a 32 KiB pool: 48 bytes per record) makes
 * it queue a 431 and then overwrite its own state: the client is never answered and the
 * connection is held until the idle timeout. The transport therefore refuses, before that
 * parse, any target longer than RL_URI_MAX_BYTES or with more than RL_QUERY_PARAMS_MAX
 * parameters: with the target at most a quarter of the pool it fits in the read buffer's first
 * allocation (half the pool), and 64 records (3 KiB) fit in what is left. The API's own queries
 * use at most two parameters. */

#define RL_POOL_BYTES (32 * 1024)
#define RL_URI_MAX_BYTES (RL_POOL_BYTES / 4)
#define RL_QUERY_PARAMS_MAX 64

enum rl_uri_verdict {
    RL_URI_OK = 0,
    RL_URI_TOO_LONG,        /* longer than RL_URI_MAX_BYTES */
    RL_URI_TOO_MANY_PARAMS, /* more than RL_QUERY_PARAMS_MAX query parameters */
};

/* Judges a request target (path and query, as received: uri[0..len)). Parameters are counted as
 * libmicrohttpd splits them: every '&'-separated piece after the first '?', empty ones included.
 * A pure function. */
enum rl_uri_verdict rl_uri_check(const char *uri, size_t len);

/* A fixed name for a verdict, for logs and tests ("ok", "uri_too_long",
 * "too_many_query_parameters"). */
const char *rl_uri_verdict_name(enum rl_uri_verdict v);

#endif
