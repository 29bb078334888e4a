#include "idemgate/gcommit.h"

int gc_take(int writing, size_t queued, size_t batch, double oldest_age_ms)
{
    if (queued == 0)
        return 0;
    return writing <= 0 || queued >= batch || oldest_age_ms >= GC_STALL_MS;
}
