#include "idemgate/bodyshare.h"

#include <pthread.h>
#include <stddef.h>

/* The tenants holding request bodies now, with their bytes of them (each at most its share):
 * an open-addressing table under owners_mu, a slot taken with a tenant's first byte and given
 * back (backward-shift deletion: no tombstones) when it holds none again, so that
 * BODYSHARE_SLOTS bounds the tenants with a body in memory at once, not those ever met (a new
 * tenant's body with every slot taken, which the connections' bound rules out, would be refused
 * like one past its share). The lock is taken
 * where a body's allocation grows or is freed — a few times a body — not for each piece. */
struct owner {
    long long id; /* 0: free */
    long bytes;
};
static struct owner owners[BODYSHARE_SLOTS];
static pthread_mutex_t owners_mu = PTHREAD_MUTEX_INITIALIZER;

size_t bodyshare_home(long long id)
{
    return (size_t)(((unsigned long long)id * 0x9E3779B97F4A7C15ull) >> 32) % BODYSHARE_SLOTS;
}

int bodyshare_add(long long id, long delta, long share)
{
    int ok = 1;
    pthread_mutex_lock(&owners_mu);
    size_t i = bodyshare_home(id), k = 0;
    while (k < BODYSHARE_SLOTS && owners[i].id != 0 && owners[i].id != id) {
        i = (i + 1) % BODYSHARE_SLOTS;
        k++;
    }
    if (k == BODYSHARE_SLOTS || (owners[i].id == 0 && delta <= 0)) {
        ok = delta <= 0; /* full (refused), or nothing held to give back (cannot happen) */
    } else if (delta > 0 && share > 0 && owners[i].bytes + delta > share) {
        ok = 0;
    } else {
        owners[i].id = id;
        owners[i].bytes += delta;
        if (owners[i].bytes <= 0) { /* holds none: its slot freed, the chain behind it closed */
            owners[i].id = 0;
            owners[i].bytes = 0;
            for (size_t j = (i + 1) % BODYSHARE_SLOTS; owners[j].id != 0; j = (j + 1) % BODYSHARE_SLOTS) {
                size_t h = bodyshare_home(owners[j].id);
                /* j's entry may move into the hole at i unless its home lies in (i, j] */
                if ((j > i && (h <= i || h > j)) || (j < i && h <= i && h > j)) {
                    owners[i] = owners[j];
                    owners[j].id = 0;
                    owners[j].bytes = 0;
                    i = j;
                }
            }
        }
    }
    pthread_mutex_unlock(&owners_mu);
    return ok;
}

/* The slot of tenant id, or BODYSHARE_SLOTS (under owners_mu). */
static size_t owner_find(long long id)
{
    size_t i = bodyshare_home(id);
    for (size_t k = 0; k < BODYSHARE_SLOTS && owners[i].id != 0; k++) {
        if (owners[i].id == id)
            return i;
        i = (i + 1) % BODYSHARE_SLOTS;
    }
    return BODYSHARE_SLOTS;
}

long bodyshare_of(long long id)
{
    pthread_mutex_lock(&owners_mu);
    size_t i = owner_find(id);
    long b = i < BODYSHARE_SLOTS ? owners[i].bytes : 0;
    pthread_mutex_unlock(&owners_mu);
    return b;
}

int bodyshare_tenants(void)
{
    int n = 0;
    pthread_mutex_lock(&owners_mu);
    for (size_t i = 0; i < BODYSHARE_SLOTS; i++)
        n += owners[i].id != 0;
    pthread_mutex_unlock(&owners_mu);
    return n;
}
