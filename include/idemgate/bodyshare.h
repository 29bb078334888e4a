#ifndef IDEMGATE_BODYSHARE_H
#define IDEMGATE_BODYSHARE_H

#include <stddef.h>

/* Each tenant's bytes of the request bodies held in memory, for its share of the bound all
 * bodies share (http_server.c): the tenants holding bodies now, process-wide. */

/* At most this many tenants hold bodies at once: more than the connections a process can have
 * open (max_connections is at most 100 000), so that a tenant's body is never refused for want
 * of a slot. The table: 16 bytes a slot, touched only where used. */
#define BODYSHARE_SLOTS 131072

/* Adds delta bytes to tenant id's (> 0): 1, or 0 when a positive delta would pass share (0 or
 * less: no share) or no slot is free — nothing added then. A tenant holding none (its bytes back
 * to 0 or less) has no slot. Thread-safe. */
int bodyshare_add(long long id, long delta, long share);

/* The slot where tenant id's search starts (ids that share it are kept apart by probing). */
size_t bodyshare_home(long long id);

/* Tenant id's bytes now (0 when it holds none); the tenants holding some. For tests. */
long bodyshare_of(long long id);
int bodyshare_tenants(void);

#endif
