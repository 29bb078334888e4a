#include "idemgate/reqlimit.h"

#include <string.h>

enum rl_uri_verdict rl_uri_check(const char *uri, size_t len)
{
    if (len > RL_URI_MAX_BYTES)
        return RL_URI_TOO_LONG;
    const char *q = memchr(uri, '?', len);
    if (!q)
        return RL_URI_OK;
    size_t params = 1;
    for (const char *p = q + 1; p < uri + len; p++)
        if (*p == '&' && ++params > RL_QUERY_PARAMS_MAX)
            return RL_URI_TOO_MANY_PARAMS;
    return RL_URI_OK;
}

const char *rl_uri_verdict_name(enum rl_uri_verdict v)
{
    switch (v) {
    case RL_URI_OK:
        return "ok";
    case RL_URI_TOO_LONG:
        return "uri_too_long";
    case RL_URI_TOO_MANY_PARAMS:
        return "too_many_query_parameters";
    }
    return "unknown";
}
