#include "idemgate/crash.h"

#ifdef IG_CRASHPOINTS
#include "idemgate/log.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static atomic_long hits;
static atomic_int paused;

/* The number after "name:" when spec (an environment variable's value) names this point, dflt
 * when it names it alone; -1 when it names another point or is absent. */
static long named(const char *spec, const char *name, long dflt)
{
    size_t n = strlen(name);
    if (!spec || strncmp(spec, name, n) != 0 || (spec[n] != '\0' && spec[n] != ':'))
        return -1;
    return spec[n] == ':' ? strtol(spec + n + 1, NULL, 10) : dflt;
}

void crash_point(const char *name)
{
    long ms = named(getenv("IDEMGATE_PAUSE"), name, 1000);
    if (ms > 0 && atomic_exchange(&paused, 1) == 0) {
        LOG(LOG_WARN, "pause_point", LS("point", name), LI("ms", ms));
        struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = ms % 1000 * 1000000L};
        while (nanosleep(&ts, &ts) != 0)
            ;
    }
    long want = named(getenv("IDEMGATE_CRASH"), name, 1);
    if (want > 0 && atomic_fetch_add(&hits, 1) + 1 == want) {
        LOG(LOG_WARN, "crash_point", LS("point", name));
        raise(SIGKILL);
    }
}
#else
/* Keeps the translation unit non-empty in release builds (ISO C requires it). */
typedef int crash_points_compiled_out;
#endif
