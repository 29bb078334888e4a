/* Job ids: drawn from a per-thread pool of random bytes (crypto.c). Every id is well formed
 * ("job_" and 26 base32 characters), and none repeats — across many refills of one thread's
 * pool and between threads drawing at the same time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "idemgate/crypto.h"

#define PER_THREAD 2000 /* ids each thread draws: many refills of a 32-id pool */
#define THREADS 4

static int well_formed(const char *id)
{
    if (strlen(id) != 30 || memcmp(id, "job_", 4) != 0)
        return 0;
    for (const char *p = id + 4; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '2' && *p <= '7')))
            return 0;
    return 1;
}

static int by_text(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

static void *draw(void *arg)
{
    char(*ids)[CRYPTO_JOB_ID_LEN] = arg;
    for (int i = 0; i < PER_THREAD; i++)
        if (crypto_job_id(ids[i]) < 0)
            ids[i][0] = '\0';
    return NULL;
}

/* Sorted, no two alike and each well formed. */
static void assert_distinct(char (*ids)[CRYPTO_JOB_ID_LEN], size_t n)
{
    qsort(ids, n, sizeof(ids[0]), by_text);
    for (size_t i = 0; i < n; i++) {
        if (!well_formed(ids[i]))
            fail_msg("malformed id '%s'", ids[i]);
        if (i && strcmp(ids[i - 1], ids[i]) == 0)
            fail_msg("id %s drawn twice", ids[i]);
    }
}

static void test_one_thread_never_repeats(void **state)
{
    (void)state;
    char(*ids)[CRYPTO_JOB_ID_LEN] = calloc(PER_THREAD, sizeof(*ids));
    assert_non_null(ids);
    draw(ids);
    assert_distinct(ids, PER_THREAD);
    free(ids);
}

static void test_threads_never_share(void **state)
{
    (void)state;
    char(*ids)[CRYPTO_JOB_ID_LEN] = calloc((size_t)PER_THREAD * THREADS, sizeof(*ids));
    assert_non_null(ids);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, draw, ids + (size_t)i * PER_THREAD), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    assert_distinct(ids, (size_t)PER_THREAD * THREADS);
    free(ids);
}

static unsigned b32_value(char c)
{
    return c >= 'a' ? (unsigned)(c - 'a') : 26u + (unsigned)(c - '2');
}

/* Each random 5-bit character is used: over many ids every position after the instant takes
 * many values (a pool handed out wrongly — the same bytes, or zeroed ones — would not). */
static void test_every_position_varies(void **state)
{
    (void)state;
    char id[CRYPTO_JOB_ID_LEN];
    unsigned seen[26] = {0}; /* bit value per position */
    for (int i = 0; i < 500; i++) {
        assert_int_equal(crypto_job_id(id), 0);
        for (int k = CRYPTO_JOB_ID_TIME_CHARS; k < 26; k++)
            seen[k] |= 1u << b32_value(id[4 + k]);
    }
    for (int k = CRYPTO_JOB_ID_TIME_CHARS; k < 26; k++) /* 80 random bits: 5 in each */
        assert_true(__builtin_popcount(seen[k]) >= 20);
}

/* The first characters are the instant, most significant first: ids made within one window of
 * 2^15 ms share their first seven characters (their index entries land together), and the
 * instant reads back. */
static void test_the_instant_leads(void **state)
{
    (void)state;
    static const long long at[] = {0, 1, 31, 32, 1796500000000LL, 1796500000999LL,
                                   (1LL << 50) - 1};
    for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
        char id[CRYPTO_JOB_ID_LEN];
        assert_int_equal(crypto_job_id_at(at[i], id), 0);
        long long back = 0;
        for (int k = 0; k < CRYPTO_JOB_ID_TIME_CHARS; k++)
            back = back * 32 + b32_value(id[4 + k]);
        assert_true(back == at[i]);
        assert_int_equal(strlen(id), 30);
    }
    char a[CRYPTO_JOB_ID_LEN], b[CRYPTO_JOB_ID_LEN];
    assert_int_equal(crypto_job_id_at(1796500000000LL, a), 0);
    assert_int_equal(crypto_job_id_at(1796500000999LL, b), 0);
    assert_memory_equal(a, b, 4 + 7);
    assert_true(strcmp(a + 4 + CRYPTO_JOB_ID_TIME_CHARS, b + 4 + CRYPTO_JOB_ID_TIME_CHARS) != 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_thread_never_repeats),
        cmocka_unit_test(test_threads_never_share),
        cmocka_unit_test(test_every_position_varies),
        cmocka_unit_test(test_the_instant_leads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
