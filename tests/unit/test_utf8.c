/* UTF-8 checks and repair, as tables: what a UTF8 database takes as text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/utf8.h"

static const struct {
    const char *in;   /* NUL-terminated */
    int valid;
    const char *repaired;
} rows[] = {
    {"", 1, ""},
    {"plain ascii, longer than eight bytes", 1, "plain ascii, longer than eight bytes"},
    {"caf\xC3\xA9", 1, "caf\xC3\xA9"},
    {"\xE6\x97\xA5\xE6\x9C\xAC", 1, "\xE6\x97\xA5\xE6\x9C\xAC"},   /* CJK */
    {"\xF0\x9F\x98\x80 ok", 1, "\xF0\x9F\x98\x80 ok"},             /* emoji */
    /* a text cut at a byte count, inside its last character */
    {"task failed: caf\xC3", 0, "task failed: caf\xEF\xBF\xBD"},
    {"\xE6\x97", 0, "\xEF\xBF\xBD\xEF\xBF\xBD"},
    /* Latin-1, a stray continuation byte, an overlong form, a surrogate, past U+10FFFF */
    {"caf\xE9!", 0, "caf\xEF\xBF\xBD!"},
    {"a\x80z", 0, "a\xEF\xBF\xBDz"},
    {"\xC0\xAF", 0, "\xEF\xBF\xBD\xEF\xBF\xBD"},
    {"\xED\xA0\x80", 0, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
    {"\xF4\x90\x80\x80", 0, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
    /* a bad byte after eight ASCII ones (the word-at-a-time path) */
    {"01234567\xFF", 0, "01234567\xEF\xBF\xBD"},
};

static void test_valid_and_repair(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        if (utf8_valid(rows[i].in, strlen(rows[i].in)) != rows[i].valid)
            fail_msg("row %zu: valid", i);
        char *r = utf8_repair(rows[i].in);
        assert_non_null(r);
        if (strcmp(r, rows[i].repaired) != 0)
            fail_msg("row %zu: repaired", i);
        if (!utf8_valid(r, strlen(r)))
            fail_msg("row %zu: the repair is not UTF-8", i);
        free(r);
    }
}

static void test_seq_never_reads_past_avail(void **state)
{
    (void)state;
    const unsigned char two[] = {0xC3, 0xA9};
    assert_int_equal(utf8_seq(two, 2), 2);
    assert_int_equal(utf8_seq(two, 1), 0);
    assert_int_equal(utf8_seq((const unsigned char *)"a", 1), 0);
}

static void test_trim_cut(void **state)
{
    (void)state;
    static const struct {
        const char *in, *want;
    } cuts[] = {
        {"", ""},
        {"abc", "abc"},
        {"caf\xC3\xA9", "caf\xC3\xA9"},
        {"caf\xC3", "caf"},
        {"x\xE6\x97", "x"},
        {"x\xF0\x9F\x98", "x"},
        {"x\xF0\x9F\x98\x80", "x\xF0\x9F\x98\x80"},
        {"\x80\x80", "\x80\x80"}, /* no start byte: left for the repair */
    };
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        char buf[32];
        snprintf(buf, sizeof(buf), "%s", cuts[i].in);
        utf8_trim_cut(buf);
        if (strcmp(buf, cuts[i].want) != 0)
            fail_msg("row %zu", i);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_and_repair),
        cmocka_unit_test(test_seq_never_reads_past_avail),
        cmocka_unit_test(test_trim_cut),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
