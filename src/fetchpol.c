#include "idemgate/fetchpol.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const class_names[] = {"public",     "private",  "loopback",
                                          "link-local", "reserved", "invalid"};

const char *fp_addr_class_name(enum fp_addr_class c)
{
    return (unsigned)c <= FP_INVALID ? class_names[c] : "invalid";
}

/* An IPv4 address (host order) against the special-purpose registry (RFC 6890 and after). */
static enum fp_addr_class class_v4(uint32_t a)
{
    static const struct {
        uint32_t net;
        int bits;
        enum fp_addr_class c;
    } table[] = {
        {0x00000000, 8, FP_RESERVED},    /* 0.0.0.0/8 "this network" */
        {0x0A000000, 8, FP_PRIVATE},     /* 10/8 */
        {0x64400000, 10, FP_PRIVATE},    /* 100.64/10 shared address space (CGNAT) */
        {0x7F000000, 8, FP_LOOPBACK},    /* 127/8 */
        {0xA9FE0000, 16, FP_LINK_LOCAL}, /* 169.254/16, cloud metadata endpoints */
        {0xAC100000, 12, FP_PRIVATE},    /* 172.16/12 */
        {0xC0000000, 24, FP_RESERVED},   /* 192.0.0/24 IETF protocol assignments */
        {0xC0000200, 24, FP_RESERVED},   /* 192.0.2/24 TEST-NET-1 */
        {0xC0A80000, 16, FP_PRIVATE},    /* 192.168/16 */
        {0xC6120000, 15, FP_RESERVED},   /* 198.18/15 benchmarking */
        {0xC6336400, 24, FP_RESERVED},   /* 198.51.100/24 TEST-NET-2 */
        {0xCB007100, 24, FP_RESERVED},   /* 203.0.113/24 TEST-NET-3 */
        {0xE0000000, 4, FP_RESERVED},    /* 224/4 multicast */
        {0xF0000000, 4, FP_RESERVED},    /* 240/4 reserved, 255.255.255.255 broadcast */
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        uint32_t mask = table[i].bits ? ~0u << (32 - table[i].bits) : 0;
        if ((a & mask) == table[i].net)
            return table[i].c;
    }
    return FP_PUBLIC;
}

static uint32_t v4_at(const unsigned char *b)
{
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

static enum fp_addr_class class_v6(const unsigned char *b)
{
    static const unsigned char zero[16];
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    static const unsigned char nat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
    if (memcmp(b, zero, 15) == 0)
        return b[15] == 1 ? FP_LOOPBACK : FP_RESERVED; /* ::1, and :: unspecified */
    /* An IPv4 address in IPv6 clothing is judged as that IPv4 address. */
    if (memcmp(b, mapped, 12) == 0 || memcmp(b, zero, 12) == 0 || memcmp(b, nat64, 12) == 0)
        return class_v4(v4_at(b + 12));
    if (b[0] == 0xff)
        return FP_RESERVED; /* ff00::/8 multicast */
    if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80)
        return FP_LINK_LOCAL; /* fe80::/10 */
    if (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0)
        return FP_RESERVED; /* fec0::/10 deprecated site-local */
    if ((b[0] & 0xfe) == 0xfc)
        return FP_PRIVATE; /* fc00::/7 unique local */
    if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x0d && b[3] == 0xb8)
        return FP_RESERVED; /* 2001:db8::/32 documentation */
    if (b[0] == 0x01 && b[1] == 0 && memcmp(b + 2, zero, 6) == 0)
        return FP_RESERVED; /* 100::/64 discard */
    if (b[0] == 0x20 && b[1] == 0x02)
        return class_v4(v4_at(b + 2)); /* 2002::/16 6to4 embeds an IPv4 address */
    return FP_PUBLIC;
}

enum fp_addr_class fp_addr_class(const char *ip)
{
    unsigned char b[16];
    if (!ip)
        return FP_INVALID;
    if (inet_pton(AF_INET, ip, b) == 1)
        return class_v4(v4_at(b));
    /* A zone index ("fe80::1%eth0") is only legal on link-local addresses. */
    char tmp[64];
    size_t n = strcspn(ip, "%");
    if (n >= sizeof(tmp))
        return FP_INVALID;
    memcpy(tmp, ip, n);
    tmp[n] = '\0';
    if (inet_pton(AF_INET6, tmp, b) == 1)
        return class_v6(b);
    return FP_INVALID;
}

int fp_addr_allowed(const char *ip, int allow_private)
{
    enum fp_addr_class c = fp_addr_class(ip);
    return c == FP_PUBLIC || (allow_private && c != FP_INVALID);
}

/* The parts of an absolute URL (each a new string, or NULL); 0 or -1. */
struct url_parts {
    char *scheme, *host, *port, *user, *password;
};

static void parts_fini(struct url_parts *u)
{
    curl_free(u->scheme);
    curl_free(u->host);
    curl_free(u->port);
    curl_free(u->user);
    curl_free(u->password);
    memset(u, 0, sizeof(*u));
}

static int parts_of(const char *url, struct url_parts *u)
{
    memset(u, 0, sizeof(*u));
    CURLU *h = curl_url();
    if (!h)
        return -1;
    int rc = -1;
    if (curl_url_set(h, CURLUPART_URL, url, 0) == CURLUE_OK &&
        curl_url_get(h, CURLUPART_SCHEME, &u->scheme, 0) == CURLUE_OK &&
        curl_url_get(h, CURLUPART_HOST, &u->host, 0) == CURLUE_OK &&
        curl_url_get(h, CURLUPART_PORT, &u->port, CURLU_DEFAULT_PORT) == CURLUE_OK) {
        (void)curl_url_get(h, CURLUPART_USER, &u->user, 0);
        (void)curl_url_get(h, CURLUPART_PASSWORD, &u->password, 0);
        rc = 0;
    }
    curl_url_cleanup(h);
    if (rc < 0)
        parts_fini(u);
    return rc;
}

/* 1 when two parsed URLs have the same scheme, host and port. */
static int same_parts(const struct url_parts *u, const struct url_parts *o)
{
    return !strcasecmp(u->scheme, o->scheme) && !strcasecmp(u->host, o->host) &&
           !strcmp(u->port, o->port);
}

static int host_listed(const struct fp_policy *pol, const char *host)
{
    size_t hl = strlen(host);
    for (size_t i = 0; i < pol->n_hosts; i++) {
        const char *h = pol->hosts[i];
        size_t n = strlen(h);
        if (h[0] == '.') {
            if (hl > n && strcasecmp(host + hl - n, h) == 0)
                return 1;
        } else if (strcasecmp(host, h) == 0) {
            return 1;
        }
    }
    return 0;
}

int fp_url_allowed(const struct fp_policy *pol, const char *url, const char *same_origin, char *why,
                   size_t whylen)
{
    struct url_parts u, o;
    if (!url || parts_of(url, &u) < 0) {
        snprintf(why, whylen, "not an absolute URL");
        return -1;
    }
    int rc = -1;
    if (strcasecmp(u.scheme, "https") != 0 &&
        !(strcasecmp(u.scheme, "http") == 0 && (pol->allow_http || same_origin)))
        snprintf(why, whylen, "scheme %s is not allowed for outputs", u.scheme);
    else if (u.user || u.password)
        snprintf(why, whylen, "a URL with credentials is not fetched");
    else if (same_origin) {
        if (parts_of(same_origin, &o) < 0) {
            snprintf(why, whylen, "the provider's base URL does not parse");
        } else {
            if (!same_parts(&u, &o))
                snprintf(why, whylen, "a content endpoint must be on the provider's origin");
            else
                rc = 0;
            parts_fini(&o);
        }
    } else if (!host_listed(pol, u.host))
        snprintf(why, whylen, "host %.200s is not a declared output host", u.host);
    else
        rc = 0;
    parts_fini(&u);
    return rc;
}

int fp_same_origin(const char *a, const char *b)
{
    struct url_parts u, o;
    if (!a || !b || parts_of(a, &u) < 0)
        return 0;
    int same = 0;
    if (parts_of(b, &o) == 0) {
        same = same_parts(&u, &o);
        parts_fini(&o);
    }
    parts_fini(&u);
    return same;
}

int fp_redirect_resolve(const char *from, const char *location, char **next)
{
    *next = NULL;
    CURLU *h = curl_url();
    char *abs = NULL;
    /* The redirect is resolved against the URL that answered it. */
    if (h && location && curl_url_set(h, CURLUPART_URL, from, 0) == CURLUE_OK &&
        curl_url_set(h, CURLUPART_URL, location, 0) == CURLUE_OK &&
        curl_url_get(h, CURLUPART_URL, &abs, 0) == CURLUE_OK)
        *next = strdup(abs);
    curl_free(abs);
    curl_url_cleanup(h);
    return *next != NULL;
}

int fp_redirect_same_origin(const char *from, const char *location, char **next)
{
    char *abs;
    if (!fp_redirect_resolve(from, location, &abs))
        return 0;
    struct url_parts a, b;
    if (parts_of(from, &a) == 0) {
        if (parts_of(abs, &b) == 0) {
            if (!strcasecmp(a.scheme, b.scheme) && !strcasecmp(a.host, b.host) &&
                !strcmp(a.port, b.port) && !b.user && !b.password) {
                *next = abs;
                abs = NULL;
            }
            parts_fini(&b);
        }
        parts_fini(&a);
    }
    free(abs);
    return *next != NULL;
}

int fp_redirect_allowed(const struct fp_policy *pol, const char *from, const char *location,
                        char **next, char *why, size_t whylen)
{
    if (fp_redirect_same_origin(from, location, next))
        return 1;
    if (!fp_redirect_resolve(from, location, next)) {
        snprintf(why, whylen, "a redirect whose Location cannot be read");
        return 0;
    }
    char pwhy[256];
    if (fp_url_allowed(pol, *next, NULL, pwhy, sizeof(pwhy)) == 0)
        return 1;
    free(*next);
    *next = NULL;
    snprintf(why, whylen, "redirect to another host refused (%s)", pwhy);
    return 0;
}
