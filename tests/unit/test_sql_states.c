/* The state machine in fact: every state the SQL writes is a move its statement declares, and
 * every declared move is an edge of states.c. The test reads both the C tables beside the SQL
 * (db_stmt.moves, .filters) and the SQL text itself. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/lease.h"
#include "idemgate/store.h"

static size_t all_statements(const struct db_stmt **out, size_t cap)
{
    size_t n_store = 0, n_lease = 0, k = 0;
    const struct db_stmt *const *s = store_statements(&n_store);
    const struct db_stmt *const *l = lease_statements(&n_lease);
    for (size_t i = 0; i < n_store && k < cap; i++)
        out[k++] = s[i];
    for (size_t i = 0; i < n_lease && k < cap; i++)
        out[k++] = l[i];
    return k;
}

static int writes_operations(const struct db_stmt *s)
{
    return strstr(s->sql, "UPDATE operations") || strstr(s->sql, "INSERT INTO operations");
}

/* 1 when state st is named by s's declared moves or filters. */
static int covered(const struct db_stmt *s, enum op_state st)
{
    for (const struct db_move *m = s->moves; m && m->from >= 0; m++)
        if (m->from == (int)st || m->to == st)
            return 1;
    for (const enum op_state *f = s->filters; f && *f != ST__COUNT; f++)
        if (*f == st)
            return 1;
    return 0;
}

/* Every single-quoted literal of the SQL that names a state (`state = 'x'`, `IN ('x', 'y')`,
 * CASE results, arrays) must be covered. Returns the first one that is not, copied into bad. */
static int uncovered_literal(const struct db_stmt *s, char *bad, size_t badlen)
{
    const char *p = s->sql;
    while ((p = strchr(p, '\'')) != NULL) {
        const char *end = strchr(p + 1, '\'');
        if (!end)
            return 0;
        char lit[64];
        size_t n = (size_t)(end - p - 1);
        if (n < sizeof(lit)) {
            memcpy(lit, p + 1, n);
            lit[n] = '\0';
            int st = st_parse(lit);
            if (st >= 0 && !covered(s, (enum op_state)st)) {
                snprintf(bad, badlen, "%s", lit);
                return 1;
            }
        }
        p = end + 1;
    }
    return 0;
}

/* A move is an edge of the state machine, a keep of a live state, or a new row in an initial
 * state. */
static int legal(const struct db_move *m)
{
    if (m->from == DB_NEW_ROW)
        return st_is_initial(m->to);
    if (m->from == (int)m->to)
        return !st_is_terminal(m->to);
    return st_can_transition((enum op_state)m->from, m->to);
}

static void test_declared_moves_are_edges(void **state)
{
    (void)state;
    const struct db_stmt *all[128];
    size_t n = all_statements(all, 128);
    assert_true(n > 20);
    for (size_t i = 0; i < n; i++) {
        const struct db_stmt *s = all[i];
        if (writes_operations(s) && !(s->moves && s->moves[0].from >= 0))
            fail_msg("%s writes operations but declares no move", s->name);
        for (const struct db_move *m = s->moves; m && m->from >= 0; m++)
            if (!legal(m))
                fail_msg("%s: %s -> %s is not an edge of states.c", s->name,
                         m->from == DB_NEW_ROW ? "(new row)" : st_name((enum op_state)m->from),
                         st_name(m->to));
        /* A state the statement only filters on is never one it moves from. */
        for (const enum op_state *f = s->filters; f && *f != ST__COUNT; f++)
            for (const struct db_move *m = s->moves; m && m->from >= 0; m++)
                if (m->from == (int)*f)
                    fail_msg("%s: %s is both filtered out and moved", s->name, st_name(*f));
    }
}

static void test_sql_names_only_declared_states(void **state)
{
    (void)state;
    const struct db_stmt *all[128];
    size_t n = all_statements(all, 128);
    for (size_t i = 0; i < n; i++) {
        char bad[64];
        if (all[i]->moves && uncovered_literal(all[i], bad, sizeof(bad)))
            fail_msg("%s names state '%s' outside its declared moves", all[i]->name, bad);
    }
}

/* The converse: no edge of states.c is dead (each is a move some statement makes). */
static void test_every_edge_is_performed(void **state)
{
    (void)state;
    const struct db_stmt *all[128];
    size_t n = all_statements(all, 128);
    for (int f = 0; f < ST__COUNT; f++)
        for (int t = 0; t < ST__COUNT; t++) {
            if (!st_can_transition((enum op_state)f, (enum op_state)t))
                continue;
            int found = 0;
            for (size_t i = 0; i < n && !found; i++)
                found = db_stmt_moves(all[i], f, (enum op_state)t);
            if (!found)
                fail_msg("%s -> %s is allowed but no statement performs it",
                         st_name((enum op_state)f), st_name((enum op_state)t));
        }
}

/* Wake-ups are told by the functions that run these statements, after their commit (wake.h):
 * intake's caller (intake.c; the group commit's intake_plain and intake_rows as well),
 * store_regenerate, store_cancel, store_resolve, store_finish and store_finish_many (finish and
 * finish_rows), and a lost claim's give-back (claim_lost). A new statement that can leave an
 * operation prepared, completed or failed must join them, or dispatchers and waiting clients
 * learn of it only by their polls. */
static void test_waited_states_are_signalled(void **state)
{
    (void)state;
    static const char *const signalled[] = {"intake", "intake_plain", "intake_rows", "regenerate",
                                            "cancel", "resolve",      "finish",      "finish_rows",
                                            "claim_lost"};
    const struct db_stmt *all[128];
    size_t n = all_statements(all, 128);
    for (size_t i = 0; i < n; i++) {
        int waited = 0, known = 0;
        for (const struct db_move *m = all[i]->moves; m && m->from >= 0; m++)
            waited |= m->from != (int)m->to && (m->to == ST_PREPARED || st_is_terminal(m->to));
        for (size_t k = 0; k < sizeof(signalled) / sizeof(signalled[0]); k++)
            known |= strcmp(all[i]->name, signalled[k]) == 0;
        if (waited && !known)
            fail_msg("%s can leave an operation prepared or terminal: call wake_state after "
                     "it commits, and list it here",
                     all[i]->name);
        if (known && !waited)
            fail_msg("%s is listed as signalled but moves nothing anyone waits for", all[i]->name);
    }
}

/* The scanner itself: a state written outside the declared moves is caught. */
static void test_scanner_catches_undeclared_state(void **state)
{
    (void)state;
    const struct db_stmt s = {
        .name = "bogus",
        .sql = "UPDATE operations SET state = CASE WHEN x THEN 'review' ELSE 'unknown' END "
               "WHERE state IN ('sending') AND last_error <> 'canceled'",
        .moves = DB_MOVES({ST_SENDING, ST_UNKNOWN}),
    };
    char bad[64];
    assert_true(uncovered_literal(&s, bad, sizeof(bad)));
    assert_string_equal(bad, "review");
}

/* Each statement binds $1..$n by the names it lists, and uses every one of them. */
static void test_params_match_sql(void **state)
{
    (void)state;
    const struct db_stmt *all[128];
    size_t n = all_statements(all, 128);
    for (size_t i = 0; i < n; i++) {
        int k = 0, used[40] = {0}, max = 0;
        while (all[i]->params && all[i]->params[k])
            k++;
        for (const char *p = all[i]->sql; (p = strchr(p, '$')) != NULL; p++) {
            int v = 0;
            for (const char *q = p + 1; *q >= '0' && *q <= '9'; q++)
                v = v * 10 + (*q - '0');
            if (v > 0 && v < 40) {
                used[v] = 1;
                max = v > max ? v : max;
            }
        }
        if (max != k)
            fail_msg("%s: SQL uses $%d, %d names listed", all[i]->name, max, k);
        for (int v = 1; v <= k; v++)
            if (!used[v])
                fail_msg("%s: $%d (%s) is never used", all[i]->name, v, all[i]->params[v - 1]);
    }
}

/* The writes whose target state is a parameter refuse a move they do not declare before they
 * reach the database (db is never touched: NULL). */
static void test_parametric_writes_are_guarded(void **state)
{
    (void)state;
    struct store_claim c = {.tenant_id = 1, .id = "op_x", .lease_version = 3};
    struct store_finish f;
    int applied = 1;
    store_finish_init(&f, &c, "poll", ST_ACCEPTED);
    f.state = ST_PREPARED; /* accepted never goes back to prepared */
    assert_int_equal(store_finish(NULL, &f, &applied), STORE_EINTERNAL);
    assert_int_equal(applied, 0);
    store_finish_init(&f, &c, "create", ST_SENDING);
    f.state = ST_REVIEW; /* only reconciliation escalates */
    assert_int_equal(store_finish(NULL, &f, &applied), STORE_EINTERNAL);
    struct store_job j;
    assert_int_equal(store_resolve(NULL, 1, "t", "op_x", "found", ST_SENDING, NULL, NULL, 1, &j,
                                   &applied),
                     STORE_EINTERNAL);
}

/* The binder refuses a parameter list that does not match the statement's names. */
static void test_binder_checks_names(void **state)
{
    (void)state;
    const struct db_stmt s = {.name = "t", .sql = "SELECT $1, $2",
                              .params = DB_PARAMS("a", "b")};
    struct pg_result *r = NULL;
    assert_int_equal(db_run(NULL, &s, DB_ARGS(p_text("a", "1")), &r), STORE_EINTERNAL);
    assert_int_equal(db_run(NULL, &s, DB_ARGS(p_text("a", "1"), p_text("a", "2")), &r),
                     STORE_EINTERNAL);
    assert_int_equal(db_run(NULL, &s, DB_ARGS(p_text("a", "1"), p_int("c", 2)), &r),
                     STORE_EINTERNAL);
    assert_null(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_declared_moves_are_edges),
        cmocka_unit_test(test_sql_names_only_declared_states),
        cmocka_unit_test(test_every_edge_is_performed),
        cmocka_unit_test(test_waited_states_are_signalled),
        cmocka_unit_test(test_scanner_catches_undeclared_state),
        cmocka_unit_test(test_params_match_sql),
        cmocka_unit_test(test_parametric_writes_are_guarded),
        cmocka_unit_test(test_binder_checks_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
