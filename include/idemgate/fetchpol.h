#ifndef IDEMGATE_FETCHPOL_H
#define IDEMGATE_FETCHPOL_H

#include <stddef.h>

/* What an output fetch may reach (issue 13 §1), as pure functions: the class of an IP address,
 * whether a URL's scheme and host are ones the provider's profile allows, and whether a redirect
 * stays on the same origin. The archive worker applies them to the URL before the call and to
 * every address libcurl is about to connect to (so a name that resolves, or re-resolves, to a
 * private address is refused too). */

enum fp_addr_class {
    FP_PUBLIC = 0, /* a global unicast address */
    FP_PRIVATE,    /* RFC 1918, RFC 6598 shared (100.64/10), IPv6 unique local fc00::/7 */
    FP_LOOPBACK,   /* 127/8, ::1 */
    FP_LINK_LOCAL, /* 169.254/16 (cloud metadata), fe80::/10 */
    FP_RESERVED,   /* unspecified, multicast, broadcast, documentation, benchmarking, 0/8,
                    * 240/4, IPv6 site-local and discard */
    FP_INVALID,    /* not an IPv4 or IPv6 literal */
};

/* The class of a numeric address ("10.0.0.1", "::ffff:127.0.0.1", "fe80::1"); an IPv4-mapped or
 * IPv4-compatible IPv6 address is classed as its IPv4 address, as is NAT64's 64:ff9b::/96. */
enum fp_addr_class fp_addr_class(const char *ip);
const char *fp_addr_class_name(enum fp_addr_class c);

/* 1 when a connection to ip may be made: a public address, or any but an invalid one when
 * allow_private (the profile says so explicitly: the tests' mock on 127.0.0.1). */
int fp_addr_allowed(const char *ip, int allow_private);

/* The policy of one provider's outputs (from its profile's "archive" member). */
struct fp_policy {
    const char *const *hosts; /* allowed hosts: "cdn.example" exactly, ".example.com" any
                               * subdomain of example.com */
    size_t n_hosts;
    int allow_http; /* http:// too (https always) */
};

/* Checks url against the policy: an absolute http(s) URL without credentials, https unless
 * allow_http, its host in the list. same_origin, when not NULL, replaces the list: the URL must
 * have that URL's scheme, host and port (a provider content endpoint). Returns 0, or -1 with the
 * reason in why. */
int fp_url_allowed(const struct fp_policy *pol, const char *url, const char *same_origin, char *why,
                   size_t whylen);

/* 1 when both absolute URLs have the same scheme, host and port (default ports made explicit);
 * 0 otherwise, or when either does not parse. */
int fp_same_origin(const char *a, const char *b);

/* 1 when location (absolute, or relative to from) stays on from's scheme, host and port; then
 * *next is the absolute URL to follow (free it). 0 otherwise. */
int fp_redirect_same_origin(const char *from, const char *location, char **next);

/* location (absolute, or relative to from) as an absolute URL in *next (free it): 1, or 0 when
 * it does not parse. */
int fp_redirect_resolve(const char *from, const char *location, char **next);

/* Whether an output's fetch follows a redirect from `from` to location: on from's origin, or to
 * a URL the policy allows (https, a declared host: a content endpoint that hands out a signed
 * storage URL). 1 and *next (free it); 0 and the reason in why. */
int fp_redirect_allowed(const struct fp_policy *pol, const char *from, const char *location,
                        char **next, char *why, size_t whylen);

#endif
