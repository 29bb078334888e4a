/* Table-driven tests of output archival's decisions: the address classes an output fetch may
 * connect to (IPv4 and IPv6), the URLs and redirects a profile allows, the outputs planned from
 * each shipped profile's result shape, what follows a failed copy, and Range headers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/archive.h"
#include "idemgate/archplan.h"
#include "idemgate/fetchpol.h"
#include "idemgate/outputs.h"
#include "idemgate/profile.h"

static void test_addr_class(void **state)
{
    (void)state;
    static const struct {
        const char *ip;
        enum fp_addr_class c;
    } rows[] = {
        {"8.8.8.8", FP_PUBLIC},
        {"93.184.216.34", FP_PUBLIC},
        {"10.0.0.1", FP_PRIVATE},
        {"10.255.255.255", FP_PRIVATE},
        {"172.16.0.1", FP_PRIVATE},
        {"172.31.255.254", FP_PRIVATE},
        {"172.32.0.1", FP_PUBLIC},
        {"172.15.255.255", FP_PUBLIC},
        {"192.168.1.1", FP_PRIVATE},
        {"100.64.0.1", FP_PRIVATE},
        {"100.128.0.1", FP_PUBLIC},
        {"127.0.0.1", FP_LOOPBACK},
        {"127.255.255.254", FP_LOOPBACK},
        {"169.254.169.254", FP_LINK_LOCAL},
        {"0.0.0.0", FP_RESERVED},
        {"224.0.0.1", FP_RESERVED},
        {"255.255.255.255", FP_RESERVED},
        {"198.18.0.1", FP_RESERVED},
        {"192.0.2.7", FP_RESERVED},
        {"::1", FP_LOOPBACK},
        {"::", FP_RESERVED},
        {"fe80::1", FP_LINK_LOCAL},
        {"fe80::1%eth0", FP_LINK_LOCAL},
        {"febf::1", FP_LINK_LOCAL},
        {"fec0::1", FP_RESERVED},
        {"fc00::1", FP_PRIVATE},
        {"fd12:3456::1", FP_PRIVATE},
        {"ff02::1", FP_RESERVED},
        {"2001:db8::1", FP_RESERVED},
        {"::ffff:127.0.0.1", FP_LOOPBACK},
        {"::ffff:10.1.2.3", FP_PRIVATE},
        {"::ffff:169.254.169.254", FP_LINK_LOCAL},
        {"::ffff:8.8.8.8", FP_PUBLIC},
        {"::127.0.0.1", FP_LOOPBACK},
        {"64:ff9b::a9fe:a9fe", FP_LINK_LOCAL},
        {"2002:7f00:1::1", FP_LOOPBACK},
        {"2606:4700:4700::1111", FP_PUBLIC},
        {"2a00:1450::1", FP_PUBLIC},
        {"localhost", FP_INVALID},
        {"", FP_INVALID},
        {"1.2.3", FP_INVALID},
        {"01.2.3.4", FP_INVALID},
        {NULL, FP_INVALID},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        enum fp_addr_class got = fp_addr_class(rows[i].ip);
        if (got != rows[i].c)
            fail_msg("%s: %s, expected %s", rows[i].ip ? rows[i].ip : "NULL",
                     fp_addr_class_name(got), fp_addr_class_name(rows[i].c));
        assert_int_equal(fp_addr_allowed(rows[i].ip, 0), rows[i].c == FP_PUBLIC);
        assert_int_equal(fp_addr_allowed(rows[i].ip, 1), rows[i].c != FP_INVALID);
    }
}

static void test_url_allowed(void **state)
{
    (void)state;
    static const char *const hosts[] = {"cdn.example.com", ".blob.example.net"};
    struct fp_policy strict = {hosts, 2, 0}, lax = {hosts, 2, 1};
    static const struct {
        const char *url;
        const char *origin;
        int lax, ok;
    } rows[] = {
        {"https://cdn.example.com/a.png", NULL, 0, 1},
        {"https://CDN.example.com/a.png?sig=1", NULL, 0, 1},
        {"https://cdn.example.com:8443/a.png", NULL, 0, 1},
        {"http://cdn.example.com/a.png", NULL, 0, 0},
        {"http://cdn.example.com/a.png", NULL, 1, 1},
        {"https://x.blob.example.net/c/d", NULL, 0, 1},
        {"https://blob.example.net/c/d", NULL, 0, 0},
        {"https://evilblob.example.net/c/d", NULL, 0, 0},
        {"https://cdn.example.com.evil.org/a", NULL, 0, 0},
        {"https://other.example.com/a.png", NULL, 0, 0},
        {"https://user:pw@cdn.example.com/a.png", NULL, 0, 0},
        {"ftp://cdn.example.com/a.png", NULL, 1, 0},
        {"file:///etc/passwd", NULL, 1, 0},
        {"gs://bucket/object.mp4", NULL, 1, 0},
        {"/relative/path", NULL, 1, 0},
        {"https://api.provider.com/v1/videos/v1/content", "https://api.provider.com", 0, 1},
        {"https://api.provider.com:443/v1/x", "https://api.provider.com", 0, 1},
        {"https://cdn.example.com/v1/x", "https://api.provider.com", 0, 0},
        {"http://api.provider.com/v1/x", "https://api.provider.com", 0, 0},
        {"http://127.0.0.1:9090/v1/videos/7/content", "http://127.0.0.1:9090", 0, 1},
        {"http://127.0.0.1:9091/v1/videos/7/content", "http://127.0.0.1:9090", 0, 0},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char why[256] = "";
        int rc = fp_url_allowed(rows[i].lax ? &lax : &strict, rows[i].url, rows[i].origin, why,
                                sizeof(why));
        if ((rc == 0) != rows[i].ok)
            fail_msg("%s: %s (%s)", rows[i].url, rc == 0 ? "allowed" : "refused", why);
        if (rc < 0)
            assert_true(why[0] != '\0');
    }
}

static void test_redirect(void **state)
{
    (void)state;
    static const struct {
        const char *from, *location, *next;
    } rows[] = {
        {"https://a.example/x/y", "/z", "https://a.example/z"},
        {"https://a.example/x/y", "w", "https://a.example/x/w"},
        {"https://a.example/x", "https://a.example/q?s=1", "https://a.example/q?s=1"},
        {"https://a.example/x", "https://A.EXAMPLE/q", "https://A.EXAMPLE/q"},
        {"https://a.example/x", "https://b.example/q", NULL},
        {"https://a.example/x", "http://a.example/q", NULL},
        {"https://a.example/x", "https://a.example:8443/q", NULL},
        {"https://a.example/x", "//b.example/q", NULL},
        {"http://127.0.0.1:9/x", "http://localhost:9/x", NULL},
        {"https://a.example/x", "https://u:p@a.example/q", NULL},
        {"https://a.example/x", NULL, NULL},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char *next = NULL;
        int ok = fp_redirect_same_origin(rows[i].from, rows[i].location, &next);
        assert_int_equal(ok, rows[i].next != NULL);
        if (rows[i].next)
            assert_string_equal(next, rows[i].next);
        free(next);
    }
}

/* A redirect off the output's origin is followed only to a URL the policy allows (a declared
 * host, https unless http is allowed, no credentials): a content endpoint handing out a signed
 * storage URL. Before, every redirect to another host failed the output for good. */
static void test_redirect_allowed(void **state)
{
    (void)state;
    static const char *const hosts[] = {"cdn.example", ".storage.example"};
    struct fp_policy pol = {.hosts = hosts, .n_hosts = 2, .allow_http = 0};
    static const struct {
        const char *from, *location, *next, *why;
    } rows[] = {
        {"https://a.example/x", "/z", "https://a.example/z", NULL}, /* same origin: as before */
        {"https://a.example/x", "https://cdn.example/f?sig=1", "https://cdn.example/f?sig=1", NULL},
        {"https://a.example/x", "https://b.storage.example/f", "https://b.storage.example/f", NULL},
        {"https://a.example/x", "https://b.example/f", NULL, "redirect to another host refused"},
        {"https://a.example/x", "http://cdn.example/f", NULL, "redirect to another host refused"},
        {"https://a.example/x", "https://u:p@cdn.example/f", NULL, "redirect to another host"},
        {"https://a.example/x", "https://storage.example.evil/f", NULL, "another host refused"},
        {"https://a.example/x", NULL, NULL, "cannot be read"},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char *next = NULL, why[256] = "";
        int ok = fp_redirect_allowed(&pol, rows[i].from, rows[i].location, &next, why,
                                     sizeof(why));
        if (ok != (rows[i].next != NULL))
            fail_msg("row %zu: %d (%s)", i, ok, why);
        if (rows[i].next)
            assert_string_equal(next, rows[i].next);
        else if (!strstr(why, rows[i].why))
            fail_msg("row %zu: %s", i, why);
        free(next);
    }
}

/* An archive claim's lease holds its longest fetch and 5 s to write its end:
 * with the defaults (lease 180 s, a fetch's 300 s) every copy was cut at ~179 s. */
static void test_archive_lease(void **state)
{
    (void)state;
    static const struct {
        int lease_s;
        long timeouts_ms[2]; /* 0: a provider without an archive member */
        int want;
    } rows[] = {
        {180, {300000, 0}, 305},      /* the defaults */
        {600, {300000, 0}, 600},      /* lease_seconds already long enough */
        {180, {0, 0}, 180},           /* nothing archived */
        {3, {1500, 0}, 7},            /* whole seconds, rounded up */
        {180, {60000, 900000}, 905},  /* the longest provider's */
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        struct arch_profile ap[2] = {{.timeout_ms = rows[i].timeouts_ms[0]},
                                     {.timeout_ms = rows[i].timeouts_ms[1]}};
        struct cfg_provider p[2] = {{.archive = rows[i].timeouts_ms[0] ? &ap[0] : NULL},
                                    {.archive = rows[i].timeouts_ms[1] ? &ap[1] : NULL}};
        struct cfg c = {.providers = p, .n_providers = 2, .lease_seconds = rows[i].lease_s};
        int got = archive_lease_s(&c);
        if (got != rows[i].want)
            fail_msg("row %zu: %d, want %d", i, got, rows[i].want);
    }
}

/* Whether an output URL is on the provider's origin (its tls.ca_file then applies). */
static void test_same_origin(void **state)
{
    (void)state;
    static const struct {
        const char *a, *b;
        int same;
    } rows[] = {
        {"https://api.example/v1/files/1", "https://api.example", 1},
        {"https://API.example:443/x", "https://api.example/v1", 1}, /* default port, case */
        {"https://api.example:8443/x", "https://api.example", 0},
        {"http://api.example/x", "https://api.example", 0},
        {"https://cdn.api.example/x", "https://api.example", 0},
        {"https://api.example.evil/x", "https://api.example", 0},
        {"not a url", "https://api.example", 0},
        {NULL, "https://api.example", 0},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (fp_same_origin(rows[i].a, rows[i].b) != rows[i].same)
            fail_msg("row %zu: %s vs %s", i, rows[i].a ? rows[i].a : "(null)", rows[i].b);
}

/* A URL past its (often estimated) expiry is tried once, at its first claim, before it is
 * written `expired` untried: a backlog that delayed the first claim proves nothing of it. */
static void test_expired_untried(void **state)
{
    (void)state;
    static const struct {
        int attempts;
        double now, expires;
        int want;
    } cases[] = {
        {1, 100, 50, 0},  /* first claim, past the expiry: tried once */
        {2, 100, 50, 1},  /* tried before: expired, untried again */
        {5, 100, 50, 1},  {2, 40, 50, 0}, /* not expired */
        {2, 100, 0, 0},   /* no expiry known */
        {2, 50, 50, 1},   /* at the expiry */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (ap_expired_untried(cases[i].attempts, cases[i].now, cases[i].expires) !=
            cases[i].want)
            fail_msg("row %zu: want %d", i, cases[i].want);
}

static void test_after_failure(void **state)
{
    (void)state;
    static const struct {
        int attempts;
        double now, expires;
        int permanent;
        double rand01;
        enum ap_verdict v;
        long long min_ms, max_ms;
        int store; /* the archive store failed, not the copy */
    } rows[] = {
        {1, 1000, 0, 1, 0.5, AP_FAILED, 0, 0, 0},        /* a refused host: never again */
        {1, 1000, 5000, 1, 0.5, AP_FAILED, 0, 0, 0},     /* even with time left */
        {1, 1000, 999, 0, 0.5, AP_EXPIRED, 0, 0, 0},     /* past the URL's expiry */
        {3, 1000, 1000, 0, 0.5, AP_EXPIRED, 0, 0, 0},    /* exactly at it */
        {1, 1000, 0, 0, 0.0, AP_RETRY, 100, 100, 0},     /* never a busy loop */
        {1, 1000, 0, 0, 0.999, AP_RETRY, 100, 999, 0},   /* first retry under the 1 s base */
        {4, 1000, 0, 0, 0.999, AP_RETRY, 7000, 7999, 0}, /* 1 s * 2^3 */
        {30, 1000, 0, 0, 0.999, AP_FAILED, 0, 0, 0},     /* no expiry: a bounded number */
        {10, 1000, 0, 0, 0.5, AP_FAILED, 0, 0, 0},
        {9, 1000, 0, 0, 0.999, AP_RETRY, 59000, 60000, 0},       /* capped at 60 s */
        {30, 1000, 100000, 0, 0.999, AP_RETRY, 59000, 60000, 0}, /* with an expiry: until it */
        {5, 1000, 1002, 0, 0.999, AP_RETRY, 1900, 1900, 0}, /* the last try before the expiry */
        {5, 1000, 1000.15, 0, 0.999, AP_RETRY, 149, 150, 0},
        /* The store failed (a bucket's 5xx, a full disk): bytes kept in the result (base64, no
         * expiry) are tried again however often — never failed for the store's outage. */
        {30, 1000, 0, 0, 0.999, AP_RETRY, 59000, 60000, 1},
        {10, 1000, 0, 0, 0.5, AP_RETRY, 100, 60000, 1},
        {30, 1000, 999, 0, 0.5, AP_EXPIRED, 0, 0, 1}, /* a URL's expiry still ends it */
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        long long d = -1;
        enum ap_verdict v = ap_after_failure(rows[i].attempts, rows[i].now, rows[i].expires,
                                             rows[i].permanent, rows[i].store, rows[i].rand01,
                                             &d);
        if (v != rows[i].v || d < rows[i].min_ms || d > rows[i].max_ms)
            fail_msg("row %zu: verdict %d delay %lld", i, v, d);
    }
}

static void test_store_retry(void **state)
{
    (void)state;
    static const struct {
        double rand01;
        long long min_ms, max_ms;
    } rows[] = {
        {0.0, 5000, 5000},     {0.5, 17000, 18000}, {0.9999, 29990, 30000},
        {-1.0, 5000, 5000},    /* out of range: the floor, never a busy loop */
        {1.0, 5000, 5000},     {0.0 / 0.0, 5000, 5000}, /* NaN */
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        long long d = ap_store_retry_ms(rows[i].rand01);
        if (d < rows[i].min_ms || d > rows[i].max_ms)
            fail_msg("row %zu: %lld", i, d);
    }
}

static void test_claim_room(void **state)
{
    (void)state;
    const struct {
        int inflight_left, engine_room, batch, want;
    } rows[] = {
        {16, 100, 8, 8}, /* the batch bounds a claim */
        {3, 100, 8, 3},  /* archive_max_inflight nearly reached */
        {16, 2, 8, 2},   /* the engine nearly full (creates and polls share it) */
        {0, 100, 8, 0},  /* max_inflight reached: nothing is claimed */
        {16, 0, 8, 0},   /* the engine full */
        {-2, 100, 8, 0}, /* past it (threads raced): nothing, never a negative LIMIT */
        {16, -1, 8, 0},
        {1, 1, 1, 1},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        int got = ap_claim_room(rows[i].inflight_left, rows[i].engine_room, rows[i].batch);
        if (got != rows[i].want)
            fail_msg("row %zu: %d, want %d", i, got, rows[i].want);
    }
}

/* A row's copy never outlives its claim's lease (one lease for the whole batch). */
static void test_copy_timeout(void **state)
{
    (void)state;
    const struct {
        long configured;
        double now, lease_end, margin;
        long want;
    } rows[] = {
        {60000, 100.0, 280.0, 1.0, 60000}, /* a fresh claim: the profile's own timeout */
        {60000, 100.0, 130.0, 1.0, 29000}, /* started late in the batch: what the lease leaves */
        {60000, 100.0, 101.4, 1.0, 0},     /* 400 ms left: not started (AP_COPY_MIN_MS) */
        {60000, 100.0, 101.5, 1.0, 500},   /* exactly the least worth starting */
        {60000, 100.0, 99.0, 1.0, 0},      /* the lease ran out already */
        {1000, 100.0, 280.0, 1.0, 1000},
        {200, 100.0, 101.3, 1.0, 200},     /* a short configured timeout fits in what is left */
        {200, 100.0, 101.1, 1.0, 0},       /* 100 ms left: less than it asks */
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        long got = ap_copy_timeout_ms(rows[i].configured, rows[i].now, rows[i].lease_end,
                                      rows[i].margin);
        if (got != rows[i].want)
            fail_msg("row %zu: %ld, want %ld", i, got, rows[i].want);
    }
}

/* Buffered ends are written once the oldest waited its while, or a lease is near its end. */
static void test_ends_due(void **state)
{
    (void)state;
    const struct {
        double now, since, first_end, max_wait, margin;
        int want;
    } rows[] = {
        {10.0, 9.8, 190.0, 1.0, 2.0, 0},  /* young, leases far off: wait for more */
        {10.0, 9.0, 190.0, 1.0, 2.0, 1},  /* the oldest waited a second */
        {10.0, 9.9, 12.0, 1.0, 2.0, 1},   /* a lease within the margin */
        {10.0, 9.9, 12.01, 1.0, 2.0, 0},  /* just outside it */
        {10.0, 9.9, 5.0, 1.0, 2.0, 1},    /* a lease past its end: written at once (fenced) */
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        int got = ap_ends_due(rows[i].now, rows[i].since, rows[i].first_end, rows[i].max_wait,
                              rows[i].margin);
        if (got != rows[i].want)
            fail_msg("row %zu: %d, want %d", i, got, rows[i].want);
    }
}

/* Loads one provider from a shipped profile file (with members overridden by extra, JSON). */
static struct cfg_provider *load(const char *profile, const char *extra, size_t *n)
{
    char entry[1024];
    snprintf(entry, sizeof(entry), "[{\"name\": \"p\", \"profile\": \"%s.json\"%s%s}]", profile,
             extra ? ", " : "", extra ? extra : "");
    cJSON *arr = cJSON_Parse(entry);
    struct cfg_provider *ps = NULL;
    char err[512] = "";
    int rc = prof_load_all(arr, "test.json", "deploy/providers", &ps, n, err, sizeof(err));
    cJSON_Delete(arr);
    if (rc < 0)
        fail_msg("%s", err);
    return ps;
}

static void test_plan_shipped_profiles(void **state)
{
    (void)state;
    static const struct {
        const char *profile, *body, *remote;
        size_t n;
        enum ap_kind kind0;
        const char *url0;
        double expires0;
    } rows[] = {
        {"openai-images",
         "{\"data\":[{\"url\":\"https://o.example/1.png\"},{\"url\":\"https://o.example/2.png\"}]}",
         NULL, 2, AP_URL, "https://o.example/1.png", 1000 + 3600},
        {"openai-images", "{\"data\":[{\"b64_json\":\"UE5H\"}]}", NULL, 1, AP_B64, NULL, 0},
        {"openai-images", "{\"data\":[{\"revised_prompt\":\"x\"}]}", NULL, 0, AP_URL, NULL, 0},
        {"openai-videos", "{\"id\":\"video_1\",\"status\":\"completed\",\"expires_at\":5000}",
         "video_1", 1, AP_ENDPOINT, "https://api.openai.com/v1/videos/video_1/content", 5000},
        {"replicate", "{\"output\":[\"https://r.example/a.webp\",\"https://r.example/b.webp\"]}",
         "p1", 2, AP_URL, "https://r.example/a.webp", 1000 + 3600},
        {"fal-queue",
         "{\"images\":[{\"url\":\"https://f.example/i.png\",\"content_type\":\"image/png\"}]}",
         "r1", 1, AP_URL, "https://f.example/i.png", 1000 + 3600},
        {"runway", "{\"output\":[\"https://rw.example/v.mp4\"]}", "t1", 1, AP_URL,
         "https://rw.example/v.mp4", 1000 + 86400},
        {"luma", "{\"assets\":{\"video\":\"https://l.example/v.mp4\"}}", "g1", 1, AP_URL,
         "https://l.example/v.mp4", 1000 + 86400},
        {"vertex-veo",
         "{\"done\":true,\"response\":{\"videos\":[{\"bytesBase64Encoded\":\"TVA0\",\"mimeType\":"
         "\"video/mp4\"}]}}",
         "op1", 1, AP_B64, NULL, 0},
        {"vertex-veo", "{\"done\":true,\"response\":{\"videos\":[{\"gcsUri\":\"gs://b/o.mp4\"}]}}",
         "op1", 1, AP_URL, "gs://b/o.mp4", 1000 + 604800},
        {"keyed-async", "{\"outputs\":[{\"url\":\"https://k.example/1.png\"}]}", "gen_1", 1, AP_URL,
         "https://k.example/1.png", 1000 + 86400},
        {"replicate", "not json", "p1", 0, AP_URL, NULL, 0},
        {"openai-videos", "{}", NULL, 0, AP_ENDPOINT, NULL, 0}, /* no remote id: nothing */
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        size_t np;
        struct cfg_provider *p = load(rows[i].profile, NULL, &np);
        struct ap_plan pl;
        assert_int_equal(
            ap_plan_outputs(p, rows[i].body, strlen(rows[i].body), NULL, rows[i].remote, 1000, &pl),
            0);
        if (pl.n != rows[i].n)
            fail_msg("%s row %zu: %zu outputs", rows[i].profile, i, pl.n);
        if (pl.n) {
            assert_int_equal(pl.out[0].kind, rows[i].kind0);
            if (rows[i].url0)
                assert_string_equal(pl.out[0].url, rows[i].url0);
            else
                assert_non_null(pl.out[0].b64);
            if (rows[i].kind0 != AP_B64)
                assert_true(pl.out[0].expires_at == rows[i].expires0);
        }
        ap_plan_fini(&pl);
        prof_free_all(p, np);
    }
}

static void test_profile_archive_member(void **state)
{
    (void)state;
    size_t n;
    struct cfg_provider *p =
        load("replicate",
             "\"archive\": {\"hosts\": [\"127.0.0.1\", \".example\"], \"allow_http\": true, "
             "\"allow_private\": true, \"max_bytes\": 2048, \"timeout_ms\": 500}",
             &n);
    assert_int_equal(p->archive->n_hosts, 2);
    assert_int_equal(p->archive->allow_private, 1);
    assert_int_equal(p->archive->max_bytes, 2048);
    struct fp_policy pol = archprof_policy(p->archive);
    char why[128];
    assert_int_equal(fp_url_allowed(&pol, "http://127.0.0.1:9/files/a", NULL, why, sizeof(why)), 0);
    prof_free_all(p, n);
    /* Shipped profiles allow no host until one is declared: nothing is fetched by default. */
    p = load("replicate", NULL, &n);
    pol = archprof_policy(p->archive);
    assert_int_equal(p->archive->allow_private, 0);
    assert_int_equal(fp_url_allowed(&pol, "https://r.example/a", NULL, why, sizeof(why)), -1);
    prof_free_all(p, n);

    static const char *const bad[] = {
        "\"archive\": []",
        "\"archive\": {\"hosts\": \"a.example\"}",
        "\"archive\": {\"hosts\": [\"http://a.example\"]}",
        "\"archive\": {\"hosts\": [\"a.example:443\"]}",
        "\"archive\": {\"max_bytes\": 0}",
        "\"archive\": {\"timeout_ms\": 5}",
        "\"archive\": {\"url\": \"not a path\"}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char entry[512], err[512] = "";
        snprintf(entry, sizeof(entry), "[{\"name\": \"p\", \"profile\": \"replicate.json\", %s}]",
                 bad[i]);
        cJSON *arr = cJSON_Parse(entry);
        struct cfg_provider *ps = NULL;
        size_t m = 0;
        int rc = prof_load_all(arr, "test.json", "deploy/providers", &ps, &m, err, sizeof(err));
        cJSON_Delete(arr);
        if (rc == 0 || !strstr(err, "providers.p.archive"))
            fail_msg("%s: rc %d, %s", bad[i], rc, err);
        prof_free_all(ps, m);
    }
}

static void test_range(void **state)
{
    (void)state;
    static const struct {
        const char *hdr;
        long long size;
        int rc;
        long long first, last;
    } rows[] = {
        {NULL, 100, OUT_RANGE_NONE, 0, 99},
        {"bytes=0-9", 100, OUT_RANGE_PARTIAL, 0, 9},
        {"bytes=10-", 100, OUT_RANGE_PARTIAL, 10, 99},
        {"bytes=-10", 100, OUT_RANGE_PARTIAL, 90, 99},
        {"bytes=-1000", 100, OUT_RANGE_PARTIAL, 0, 99},
        {"bytes=90-1000", 100, OUT_RANGE_PARTIAL, 90, 99},
        {"bytes=99-99", 100, OUT_RANGE_PARTIAL, 99, 99},
        {"bytes=100-", 100, OUT_RANGE_UNSATISFIABLE, 0, 0},
        {"bytes=100-200", 100, OUT_RANGE_UNSATISFIABLE, 0, 0},
        {"bytes=-0", 100, OUT_RANGE_UNSATISFIABLE, 0, 0},
        {"bytes=0-0", 0, OUT_RANGE_UNSATISFIABLE, 0, 0},
        {"bytes=9-5", 100, OUT_RANGE_NONE, 0, 99},     /* invalid: ignored (RFC 9110) */
        {"bytes=0-1,5-6", 100, OUT_RANGE_NONE, 0, 99}, /* several ranges: the whole */
        {"items=0-1", 100, OUT_RANGE_NONE, 0, 99},
        {"bytes=a-b", 100, OUT_RANGE_NONE, 0, 99},
        {"bytes= 0-9", 100, OUT_RANGE_NONE, 0, 99},
        {"bytes=-", 100, OUT_RANGE_NONE, 0, 99},
        {"bytes=99999999999999999999-", 100, OUT_RANGE_NONE, 0, 99},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        long long first = -1, last = -1;
        int rc = out_range(rows[i].hdr, rows[i].size, &first, &last);
        if (rc != rows[i].rc)
            fail_msg("%s: %d", rows[i].hdr ? rows[i].hdr : "NULL", rc);
        if (rc != OUT_RANGE_UNSATISFIABLE) {
            assert_int_equal(first, rows[i].first);
            assert_int_equal(last, rows[i].last);
        }
    }
}

/* Issue 21 item 12: which stored Content-Types are shown inline on the console's origin; the
 * rest (HTML, SVG with its scripts, anything unknown) are downloads. */
static void test_archived_output_headers(void **state)
{
    (void)state;
    static const struct {
        const char *ct;
        int want;
    } cases[] = {
        {"image/png", 1},
        {"image/jpeg", 1},
        {"IMAGE/WEBP", 1},
        {"image/png; charset=binary", 1},
        {"video/mp4", 1},
        {"video/webm", 1},
        {"audio/mpeg", 1},
        {"audio/wav", 1},
        {"image/svg+xml", 0},
        {"image/svg+xml; charset=utf-8", 0},
        {"text/html", 0},
        {"text/html; charset=utf-8", 0},
        {"application/xhtml+xml", 0},
        {"application/pdf", 0},
        {"application/octet-stream", 0},
        {"text/plain", 0},
        {"image/png2", 0},
        {"image/pn", 0},
        {"image", 0},
        {"", 0},
        {NULL, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (out_inline_type(cases[i].ct) != cases[i].want)
            fail_msg("case %zu (%s): want %d", i, cases[i].ct ? cases[i].ct : "NULL",
                     cases[i].want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_addr_class),
        cmocka_unit_test(test_url_allowed),
        cmocka_unit_test(test_redirect),
        cmocka_unit_test(test_redirect_allowed),
        cmocka_unit_test(test_archive_lease),
        cmocka_unit_test(test_same_origin),
        cmocka_unit_test(test_after_failure),
        cmocka_unit_test(test_store_retry),
        cmocka_unit_test(test_expired_untried),
        cmocka_unit_test(test_claim_room),
        cmocka_unit_test(test_copy_timeout),
        cmocka_unit_test(test_ends_due),
        cmocka_unit_test(test_plan_shipped_profiles),
        cmocka_unit_test(test_profile_archive_member),
        cmocka_unit_test(test_range),
        cmocka_unit_test(test_archived_output_headers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
