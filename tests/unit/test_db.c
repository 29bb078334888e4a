/* Table-driven test of db_read_only_server: which servers the connection layer refuses to use
 * (issue 14 §3: a primary fenced or demoted under a running gateway, a standby named in a
 * multi-host connection string). The behaviour around it is proved against real servers by
 * tests/integration/test_failover.py (F3). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/db.h"

struct ro_case {
    const char *in_hot_standby;
    const char *default_read_only;
    int want;
};

static const struct ro_case cases[] = {
    {"off", "off", 0},  /* a primary */
    {"on", "off", 1},   /* a standby */
    {"on", "on", 1},    /* a standby set read-only too */
    {"off", "on", 1},   /* a fenced primary */
    {NULL, NULL, 0},    /* not reported (a pooler, PostgreSQL before 14): writes will tell */
    {NULL, "on", 1},    /* PostgreSQL 14+ behind something that passes only one of them */
    {"on", NULL, 1},    /* the other way round */
    {"", "", 0},        /* empty: not on */
    {"true", "yes", 0}, /* PostgreSQL reports booleans as on/off only */
};

static void test_read_only_server(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct ro_case *c = &cases[i];
        if (db_read_only_server(c->in_hot_standby, c->default_read_only) != c->want)
            fail_msg("case %zu: in_hot_standby=%s default_transaction_read_only=%s: want %d", i,
                     c->in_hot_standby ? c->in_hot_standby : "(null)",
                     c->default_read_only ? c->default_read_only : "(null)", c->want);
    }
}

/* Element i of a text[] in array_recv's form (5 words of header, then length and bytes each). */
static const unsigned char *element(const unsigned char *b, size_t i, unsigned *len)
{
    const unsigned char *at = b + 20;
    for (;;) {
        unsigned l = (unsigned)at[0] << 24 | (unsigned)at[1] << 16 | (unsigned)at[2] << 8 | at[3];
        if (i-- == 0) {
            *len = l;
            return at + 4;
        }
        at += 4 + (l == 0xffffffffu ? 0 : l);
    }
}

/* A batch's diagnostic text that is not UTF-8 is bound with U+FFFD, as one row's is; any other
 * text is bound as it is. Before, the batch's array took the bytes as they were and PostgreSQL
 * refused the whole batch (22021): every row was then written again one by one. */
static void test_rows_array_repairs_lossy_text(void **state)
{
    (void)state;
    const struct db_stmt s = {.name = "t", .sql = "", .params = DB_PARAMS("e")};
    const struct param r0[] = {p_text_lossy("e", "ok")};
    const struct param r1[] = {p_text_lossy("e", "caf\xe9 \xff")};
    const struct param r2[] = {p_text("e", NULL)};
    const struct param r3[] = {p_text("e", "\xe9")}; /* not lossy: left for the server to refuse */
    const struct param *rows[] = {r0, r1, r2, r3};
    size_t len = 0;
    unsigned l;
    unsigned char *b = db_rows_array(&s, "e", 4, rows, 1, &len);
    assert_non_null(b);
    const unsigned char *v = element(b, 0, &l);
    assert_int_equal(l, 2);
    assert_memory_equal(v, "ok", 2);
    v = element(b, 1, &l);
    assert_int_equal(l, strlen("caf\xef\xbf\xbd \xef\xbf\xbd"));
    assert_memory_equal(v, "caf\xef\xbf\xbd \xef\xbf\xbd", l);
    element(b, 2, &l);
    assert_int_equal(l, 0xffffffffu);
    v = element(b, 3, &l);
    assert_int_equal(l, 1);
    assert_memory_equal(v, "\xe9", 1);
    assert_int_equal(len, (size_t)(v + 1 - b));
    free(b);
}

/* Each row's value is found by name wherever the row holds it: a row built in another order
 * than the batch's first is read right (the first row's place is only tried first). */
static void test_rows_array_finds_each_rows_parameter_by_name(void **state)
{
    (void)state;
    const struct db_stmt s = {.name = "t", .sql = "", .params = DB_PARAMS("a", "b")};
    const struct param r0[] = {p_text("a", "a0"), p_text("b", "b0")};
    const struct param r1[] = {p_text("b", "b1"), p_text("a", "a1")};
    const struct param r2[] = {p_text("a", "a2"), p_text("c", "c2")};
    const struct param *rows[] = {r0, r1, r2};
    size_t len = 0;
    unsigned l;
    unsigned char *b = db_rows_array(&s, "b", 2, rows, 2, &len);
    assert_non_null(b);
    const unsigned char *v = element(b, 0, &l);
    assert_int_equal(l, 2);
    assert_memory_equal(v, "b0", 2);
    v = element(b, 1, &l);
    assert_int_equal(l, 2);
    assert_memory_equal(v, "b1", 2);
    free(b);
    /* A row without it: no array. */
    const struct param *short_rows[] = {r0, r2};
    assert_null(db_rows_array(&s, "b", 2, short_rows, 2, &len));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_only_server),
        cmocka_unit_test(test_rows_array_repairs_lossy_text),
        cmocka_unit_test(test_rows_array_finds_each_rows_parameter_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
