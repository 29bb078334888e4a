/* Table-driven test of db_read_only_server: which servers the connection layer refuses to use
 * (issue 14 §3: a primary fenced or demoted under a running gateway, a standby named in a
 * multi-host connection string). The behaviour around it is proved against real servers by
 * tests/integration/test_failover.py (F3). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_only_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
