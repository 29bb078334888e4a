/* The job cache's byte bound (jobcache.h): what it holds never passes job_cache_bytes, an answer
 * larger than a sixteenth of it is never held (and an earlier view of the same job is no longer
 * answered), expired entries give their memory back, and every byte held is counted once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "idemgate/jobcache.h"

#define BOUND 16384

static char body[BOUND];

/* An entry of job `id` whose answer is n bytes. */
static struct jobcache_entry entry(const char *id, size_t n)
{
    struct jobcache_entry e;
    memset(&e, 0, sizeof(e));
    snprintf(e.job_id, sizeof(e.job_id), "%s", id);
    snprintf(e.state, sizeof(e.state), "completed");
    e.job_json = (char *)"{\"object\":\"job\"}";
    e.resp_body = body;
    e.resp_body_len = n;
    return e;
}

static int held(const char *id, size_t *len)
{
    struct jobcache_entry out;
    if (!jobcache_get('j', "tokenhash", id, &out))
        return 0;
    if (len)
        *len = out.resp_body_len;
    jobcache_entry_fini(&out);
    return 1;
}

static void put(const char *id, size_t n)
{
    struct jobcache_entry e = entry(id, n);
    jobcache_put('j', "tokenhash", id, &e, 0);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_the_bound_holds(void **state)
{
    (void)state;
    memset(body, 'x', sizeof(body));
    assert_int_equal(jobcache_init(4096, 60000, BOUND), 0);
    const size_t json = strlen("{\"object\":\"job\"}") + 1;

    /* A small answer is held, and counted with its document. */
    put("job_a", 500);
    size_t len = 0;
    assert_true(held("job_a", &len));
    assert_int_equal(len, 500);
    assert_int_equal(jobcache_bytes(), 500 + 1 + json);

    /* Larger than a sixteenth of the bound: never held, and the earlier view of the same job is
     * dropped with it (never answered instead of the newer). */
    put("job_a", BOUND / JOBCACHE_ENTRY_SHARE + 1);
    assert_false(held("job_a", NULL));
    assert_int_equal(jobcache_bytes(), 0);

    /* Filled: the bytes held never pass the bound; once it is reached, more are not held while
     * the others are live. */
    char id[32];
    int kept = 0;
    for (int i = 0; i < 200; i++) {
        snprintf(id, sizeof(id), "job_%d", i);
        put(id, 900);
        assert_true(jobcache_bytes() <= BOUND);
    }
    for (int i = 0; i < 200; i++) {
        snprintf(id, sizeof(id), "job_%d", i);
        kept += held(id, NULL);
    }
    assert_true(kept > 0);
    assert_true(kept < 200);
    assert_true((size_t)kept * (900 + 1 + json) <= BOUND);

    /* Everything freed at the end. */
    jobcache_fini();
    assert_int_equal(jobcache_bytes(), 0);
}

static void test_expired_entries_give_their_memory_back(void **state)
{
    (void)state;
    memset(body, 'y', sizeof(body));
    assert_int_equal(jobcache_init(4096, 50, BOUND), 0); /* entries live 50 ms */
    char id[32];
    for (int i = 0; i < 100; i++) {
        snprintf(id, sizeof(id), "old_%d", i);
        put(id, 900);
    }
    assert_true(jobcache_bytes() > BOUND - 2000);
    put("new_0", 900);
    assert_false(held("new_0", NULL)); /* full of live entries */
    sleep_ms(250);                      /* past their time to live and the sweep's interval */
    put("new_1", 900);                  /* room is made by freeing the expired */
    assert_true(held("new_1", NULL));
    assert_true(jobcache_bytes() < 2000);
    /* A read of an expired entry frees it too. */
    snprintf(id, sizeof(id), "old_%d", 0);
    assert_false(held(id, NULL));
    jobcache_fini();
    assert_int_equal(jobcache_bytes(), 0);
}

static void test_no_bound(void **state)
{
    (void)state;
    assert_int_equal(jobcache_init(64, 60000, 0), 0);
    put("big", BOUND); /* no bound: any answer is held */
    assert_true(held("big", NULL));
    jobcache_fini();
    assert_int_equal(jobcache_bytes(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_bound_holds),
        cmocka_unit_test(test_expired_entries_give_their_memory_back),
        cmocka_unit_test(test_no_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
