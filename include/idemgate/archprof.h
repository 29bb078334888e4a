#ifndef IDEMGATE_ARCHPROF_H
#define IDEMGATE_ARCHPROF_H

#include "idemgate/fetchpol.h"
#include "idemgate/jpath.h"
#include "idemgate/members.h"

#include <cjson/cJSON.h>
#include <stddef.h>

/* A provider profile's "archive" member (issue 13 §1): where a completed operation's outputs may
 * be fetched from and how. A profile holds one (profile.h); the archive planner and workers read
 * it. It knows nothing of the rest of the profile, so profile.h can include it while archplan.h,
 * which reads whole profiles, includes profile.h: the dependency goes one way.
 *
 *   {"hosts": ["cdn.example", ".blob.example"], "allow_http": false, "allow_private": false,
 *    "max_bytes": 1073741824, "timeout_ms": 300000,
 *    "url": "$.url", "b64": "$.b64_json", "content_type": "$.mimeType"}
 *
 * url / b64 / content_type are paths inside one output object (defaults: the result's
 * output_url, "$.b64_json", none). */
struct arch_profile {
    char **hosts;
    size_t n_hosts;
    int allow_http;
    int allow_private;   /* a profile that says so may fetch from private and loopback addresses */
    long long max_bytes; /* an output larger than this is never stored */
    long timeout_ms;     /* one whole fetch */
    struct jpath *url, *b64, *content_type;
};

/* The member names of an "archive" object (members.h); profile.c checks a provider's members
 * against them before archprof_new reads them. */
extern const struct memb_table archprof_members;

/* Reads the "archive" member a (NULL when the profile has none: the defaults) of provider
 * `provider` in configuration file `file` into a new *out, which the caller frees with
 * archprof_free. Returns 0, or -1 with *out NULL and, unless out of memory, a message naming the
 * file and the field in err. */
__attribute__((warn_unused_result)) int archprof_new(const cJSON *a, const char *file,
                                                     const char *provider,
                                                     struct arch_profile **out, char *err,
                                                     size_t errlen);
/* Frees ap and everything it owns; NULL is a no-op. */
void archprof_free(struct arch_profile *ap);
/* The fetch policy of the outputs (pointers into ap; NULL: no host is allowed). */
struct fp_policy archprof_policy(const struct arch_profile *ap);

#endif
