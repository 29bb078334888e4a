#include "idemgate/clock.h"

#include "idemgate/crypto.h"

#include <errno.h>
#include <stdint.h>
#include <time.h>

double clock_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double clock_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double clock_rand01(void)
{
    uint64_t r = 0;
    if (crypto_random(&r, sizeof(r)) < 0)
        return 0.5;
    return (double)(r >> 11) / 9007199254740992.0; /* 53 random bits */
}

void clock_sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

struct clock_deadline clock_deadline_in(double seconds, double mono_now, double wall_now)
{
    return (struct clock_deadline){.mono = mono_now + seconds, .wall = wall_now + seconds};
}

int clock_deadline_passed(const struct clock_deadline *d, double mono_now, double wall_now)
{
    return mono_now > d->mono || wall_now > d->wall;
}
