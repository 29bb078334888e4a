/* A provider's credential by its reference (secrets.h): a variable, or a file read again each
 * time it was replaced. secret_trim table-driven; the file reads on a temporary folder. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "idemgate/profile.h"
#include "idemgate/provider.h"
#include "idemgate/secrets.h"
#include "idemgate/upstream.h"

static void test_trim_takes_one_line_end(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        size_t want;
    } rows[] = {
        {"tok", 3},       {"tok\n", 3},   {"tok\r\n", 3}, {"tok\n\n", 4}, /* one line end only */
        {"tok\r", 4},     {"\n", 0},      {"\r\n", 0},    {"", 0},
        {"a\nb\n", 3}, /* inside: kept (prov_secret_ok refuses it) */
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        size_t got = secret_trim(rows[i].in, strlen(rows[i].in));
        if (got != rows[i].want)
            fail_msg("row %zu: %zu, want %zu", i, got, rows[i].want);
    }
}

static char dir[] = "/tmp/idemgate-secrets-XXXXXX";

static void put(const char *name, const char *content, size_t n)
{
    char tmp[128], path[128];
    snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", dir, name);
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(tmp, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(content, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(rename(tmp, path), 0); /* replaced as an agent replaces it */
}

static void assert_reads(const char *ref, const char *want)
{
    char *got = secret_get(ref);
    if (!want) {
        if (got)
            fail_msg("%s: read %zu bytes, want nothing", ref, strlen(got));
        return;
    }
    if (!got || strcmp(got, want) != 0)
        fail_msg("%s: %s, want %s", ref, got ? got : "(nothing)", want);
    secret_free(got);
}

static void test_a_file_replaced_is_read_again(void **state)
{
    (void)state;
    assert_non_null(mkdtemp(dir));
    char ref[160];
    snprintf(ref, sizeof(ref), "%s%s/token", SECRET_FILE_PREFIX, dir);
    assert_reads(ref, NULL); /* not there yet */
    put("token", "first-token\n", 12);
    assert_reads(ref, "first-token");
    assert_reads(ref, "first-token"); /* the copy kept */
    put("token", "second-token-longer\r\n", 21);
    assert_reads(ref, "second-token-longer");
    put("token", "", 0);
    assert_reads(ref, NULL); /* empty: not set */
    put("token", "ab\0cd", 5);
    char *got = secret_get(ref);
    assert_non_null(got);
    assert_int_equal(strlen(got), 5); /* a NUL inside is not a shorter secret */
    assert_int_equal(got[2], '\x01');
    secret_free(got);
    size_t big = SECRET_FILE_MAX + 1;
    char *huge = malloc(big);
    assert_non_null(huge);
    memset(huge, 'a', big);
    put("token", huge, big);
    free(huge);
    assert_reads(ref, NULL);
    put("token", "third\n", 6);
    assert_reads(ref, "third");
    char path[160];
    snprintf(path, sizeof(path), "%s/token", dir);
    assert_int_equal(unlink(path), 0);
    assert_reads(ref, NULL); /* gone: not set, the copy kept is not used */
    assert_int_equal(rmdir(dir), 0);
    assert_true(secret_is_file(ref));
    assert_string_equal(secret_name(ref), path);
}

static void test_a_variable_is_read_as_it_is(void **state)
{
    (void)state;
    assert_int_equal(setenv("IDEMGATE_TEST_SECRET", "sk-env\n", 1), 0);
    assert_reads("IDEMGATE_TEST_SECRET", "sk-env\n"); /* not trimmed: refused when sent */
    assert_int_equal(setenv("IDEMGATE_TEST_SECRET", "", 1), 0);
    assert_reads("IDEMGATE_TEST_SECRET", NULL);
    assert_int_equal(unsetenv("IDEMGATE_TEST_SECRET"), 0);
    assert_reads("IDEMGATE_TEST_SECRET", NULL);
    assert_reads("", NULL);
    assert_false(secret_is_file("IDEMGATE_TEST_SECRET"));
    assert_string_equal(secret_name("IDEMGATE_TEST_SECRET"), "IDEMGATE_TEST_SECRET");
}

/* A secret gone between the attempt's check and the send (a file an agent replaced badly, or
 * removed): the call is never built, and says so — nothing left, so nothing can have been made
 * (read as a call that may have made its task, it used up an attempt or sent the job to an
 * operator). */
static void test_a_secret_gone_at_the_send_is_a_call_never_sent(void **state)
{
    (void)state;
    static const char *const refs[] = {"file:/nonexistent/idemgate-test/token",
                                       "IDEMGATE_TEST_SECRET_NEVER_SET"};
    struct cfg_provider p = {.auth_header = "Authorization", .auth_prefix = "Bearer "};
    for (size_t i = 0; i < sizeof(refs) / sizeof(refs[0]); i++) {
        struct prov_call c = {.method = "POST", .url = "http://127.0.0.1:9/x",
                              .credential = refs[i]};
        struct up_xfer *x = (struct up_xfer *)&p; /* must be cleared */
        struct up_response res;
        memset(&res, 0x5a, sizeof(res));
        assert_int_equal(prov_xfer_new(&p, &c, &x, &res), -1);
        assert_null(x);
        assert_int_equal(res.aborted_before_send, 1);
        assert_int_equal(res.curl_code, 0);
        assert_int_equal(res.http_status, 0);
        assert_non_null(strstr(res.error, "credential is not set"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trim_takes_one_line_end),
        cmocka_unit_test(test_a_file_replaced_is_read_again),
        cmocka_unit_test(test_a_variable_is_read_as_it_is),
        cmocka_unit_test(test_a_secret_gone_at_the_send_is_a_call_never_sent),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    secrets_fini();
    return rc;
}
