#include "idemgate/crash.h"

#ifdef IG_CRASHPOINTS
#include "idemgate/log.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_long hits;

void crash_point(const char *name)
{
    const char *spec = getenv("IDEMGATE_CRASH");
    if (!spec)
        return;
    size_t n = strlen(name);
    if (strncmp(spec, name, n) != 0 || (spec[n] != '\0' && spec[n] != ':'))
        return;
    long want = spec[n] == ':' ? strtol(spec + n + 1, NULL, 10) : 1;
    if (atomic_fetch_add(&hits, 1) + 1 == want) {
        LOG(LOG_WARN, "crash_point", LS("point", name));
        raise(SIGKILL);
    }
}
#else
/* Keeps the translation unit non-empty in release builds (ISO C requires it). */
typedef int crash_points_compiled_out;
#endif
