/* Member names of the configuration and the provider profiles (members.h): the edit distance, the
 * nearest valid name, and the check of a document against its tables, on a small table of its own
 * and on the real tables of a provider entry, a price table and an archive member. A misspelt
 * member used to be ignored in favour of its default. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/archprof.h"
#include "idemgate/members.h"
#include "idemgate/pricing.h"
#include "idemgate/profile.h"

static void test_distance(void **state)
{
    (void)state;
    static const struct {
        const char *a, *b;
        size_t want;
    } rows[] = {
        {"", "", 0},
        {"timeouts", "timeouts", 0},
        {"", "abc", 3},
        {"abc", "", 3},
        {"timeout", "timeouts", 1},
        {"intervl_ms", "interval_ms", 1},
        {"tiemouts", "timeouts", 1}, /* two neighbours swapped */
        {"Timeouts", "timeouts", 1},
        {"kitten", "sitting", 3},
        {"default_wait", "default_wait_seconds", 8},
        {"ca", "abc", 3}, /* optimal string alignment: no edit of a transposed pair */
        /* Past 64 bytes only the difference in length counts. */
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 4},
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "b", 68},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        size_t got = memb_distance(rows[i].a, rows[i].b);
        if (got != rows[i].want)
            fail_msg("row %zu: distance(%s, %s) = %zu, want %zu", i, rows[i].a, rows[i].b, got,
                     rows[i].want);
    }
}

/* A table of its own, in two parts (also). */
static const struct memb tail_m[] = {
    {"max_response_bytes", MEMB_VALUE, NULL},
    {"max_inflight_calls", MEMB_VALUE, NULL},
};
static const struct memb_table tail_t = MEMB_TABLE(tail_m, NULL);
static const struct memb leaf_m[] = {
    {"connect_ms", MEMB_VALUE, NULL},
    {"total_ms", MEMB_VALUE, NULL},
};
static const struct memb_table leaf_t = MEMB_TABLE(leaf_m, NULL);
static const struct memb route_m[] = {
    {"default_wait_seconds", MEMB_VALUE, NULL},
    {"path", MEMB_VALUE, NULL},
};
static const struct memb_table route_t = MEMB_TABLE(route_m, NULL);
static const struct memb head_m[] = {
    {"id", MEMB_VALUE, NULL},          {"mode", MEMB_VALUE, NULL},
    {"timeouts", MEMB_OBJECT, &leaf_t}, {"routes", MEMB_ARRAY, &route_t},
    {"tables", MEMB_MAP, &leaf_t},     {"headers", MEMB_VALUE, NULL},
};
static const struct memb_table own_t = MEMB_TABLE(head_m, &tail_t);

static void test_nearest(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        const char *want; /* NULL: nothing is close */
    } rows[] = {
        {"timeout", "timeouts"},
        {"Timeouts", "timeouts"},
        {"TIMEOUTS", "timeouts"},     /* equal but for case, however far */
        {"tiemouts", "timeouts"},
        {"mdoe", "mode"},
        {"modes", "mode"},
        {"max_inflight", "max_inflight_calls"}, /* a prefix; found in the also part */
        {"max_", "max_response_bytes"},         /* two prefixes at equal distance: table order */
        {"routes_x", "routes"},                 /* a valid name is a prefix of it */
        {"headers", "headers"},
        {"xyz", NULL},
        {"retries", NULL},
        {"i", "id"},   /* distance 1 is close for a short name (max(1, 3) / 3) */
        {"ab", NULL},  /* distance 2 from "id" is not */
        {"", NULL},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const char *got = memb_nearest(rows[i].name, &own_t);
        if ((got == NULL) != (rows[i].want == NULL) ||
            (got && strcmp(got, rows[i].want) != 0))
            fail_msg("row %zu: nearest(%s) = %s, want %s", i, rows[i].name,
                     got ? got : "(none)", rows[i].want ? rows[i].want : "(none)");
    }
    /* The real tables of the two examples. */
    const struct memb route_real[] = {{"route", MEMB_VALUE, NULL},
                                      {"method", MEMB_VALUE, NULL},
                                      {"path", MEMB_VALUE, NULL},
                                      {"default_wait_seconds", MEMB_VALUE, NULL}};
    const struct memb_table rt = MEMB_TABLE(route_real, NULL);
    assert_string_equal(memb_nearest("default_wait", &rt), "default_wait_seconds");
    assert_string_equal(memb_nearest("timeout", &prof_entry_members), "timeouts");
    assert_string_equal(memb_nearest("timeout", &archprof_members), "timeout_ms");
}

static void test_check(void **state)
{
    (void)state;
    /* Not static: one row names a table through a pointer. */
    const struct {
        const char *doc;
        const struct memb_table *table;
        const char *prefix;
        enum memb_problem_kind kind;
        const char *path;
        const char *suggest;
    } rows[] = {
        {"{}", &own_t, "", MEMB_OK, "", NULL},
        {"{\"id\":1,\"mode\":\"x\",\"max_inflight_calls\":3}", &own_t, "", MEMB_OK, "", NULL},
        {"{\"mode\":1,\"timeout\":5}", &own_t, "", MEMB_UNKNOWN, "timeout", "timeouts"},
        {"{\"mode\":1,\"timeout\":5}", &own_t, "providers[2]", MEMB_UNKNOWN,
         "providers[2].timeout", "timeouts"},
        {"{\"zzz\":5}", &own_t, "", MEMB_UNKNOWN, "zzz", NULL},
        /* Nested: an object, an array's elements, a map's values. */
        {"{\"timeouts\":{\"total_ms\":1,\"conect_ms\":2}}", &own_t, "", MEMB_UNKNOWN,
         "timeouts.conect_ms", "connect_ms"},
        {"{\"routes\":[{\"path\":\"/a\"},{\"path\":\"/b\",\"default_wait\":5}]}", &own_t, "p",
         MEMB_UNKNOWN, "p.routes[1].default_wait", "default_wait_seconds"},
        {"{\"tables\":{\"gpt-image-1\":{\"total_ms\":1},\"a b\":{\"totl_ms\":1}}}", &own_t, "",
         MEMB_UNKNOWN, "tables['a b'].totl_ms", "total_ms"},
        {"{\"tables\":{\"it's\":{\"x\":1}}}", &own_t, "", MEMB_UNKNOWN, "tables['it\\'s'].x",
         NULL},
        /* A value member's inside is its reader's: free names (headers) pass. */
        {"{\"headers\":{\"X-Anything\":\"1\"}}", &own_t, "", MEMB_OK, "", NULL},
        /* A value of another type than the table expects is left to the reader. */
        {"{\"timeouts\":\"5\",\"routes\":{\"x\":1},\"tables\":[1]}", &own_t, "", MEMB_OK, "",
         NULL},
        {"{\"routes\":[\"x\",{\"path\":\"/\"}]}", &own_t, "", MEMB_OK, "", NULL},
        /* cJSON keeps both of a repeated member and reads the first: refused. */
        {"{\"mode\":1,\"id\":2,\"mode\":3}", &own_t, "", MEMB_DUPLICATE, "mode", NULL},
        {"{\"tables\":{\"a\":{},\"a\":{}}}", &own_t, "", MEMB_DUPLICATE, "tables.a", NULL},
        {"{\"timeouts\":{\"total_ms\":1,\"total_ms\":2}}", &own_t, "", MEMB_DUPLICATE,
         "timeouts.total_ms", NULL},
        /* The first problem in document order. */
        {"{\"aaa\":1,\"timeout\":2}", &own_t, "", MEMB_UNKNOWN, "aaa", NULL},
        /* Names are matched case-sensitively (cJSON's own lookup is not). */
        {"{\"Mode\":1}", &own_t, "", MEMB_UNKNOWN, "Mode", "mode"},
        /* Not an object: nothing to check. */
        {"[1,2]", &own_t, "", MEMB_OK, "", NULL},
        /* The real tables. */
        {"{\"name\":\"a\",\"profile\":\"p.json\",\"base_url\":\"http://x\",\"timeout\":5}",
         &prof_entry_members, "providers[2]", MEMB_UNKNOWN, "providers[2].timeout", "timeouts"},
        {"{\"name\":\"a\",\"routes\":[{\"route\":\"r\",\"path\":\"/r\",\"default_wait\":5}]}",
         &prof_entry_members, "providers[0]", MEMB_UNKNOWN, "providers[0].routes[0].default_wait",
         "default_wait_seconds"},
        {"{\"name\":\"a\",\"poll\":{\"interval_ms\":5,\"body\":{\"anything\":1}},"
         "\"status\":{\"map\":{\"IN_QUEUE\":\"queued\"}},\"headers\":{\"X-V\":\"1\"},"
         "\"reconcile\":{\"list\":{\"cursor_param\":\"c\"},\"lookup\":{\"id\":\"$.id\"}},"
         "\"retry\":{\"body_hint\":{\"pattern\":\"x\"}}}",
         &prof_entry_members, "providers[0]", MEMB_OK, "", NULL},
        {"{\"reconcile\":{\"list\":{\"max_page\":5}}}", &prof_entry_members, "providers[0]",
         MEMB_UNKNOWN, "providers[0].reconcile.list.max_page", "max_pages"},
        {"{\"retry\":{\"body_hint\":{\"unit\":5}}}", &prof_entry_members, "providers[0]",
         MEMB_UNKNOWN, "providers[0].retry.body_hint.unit", "unit_ms"},
        {"{\"archive\":{\"timeout\":5}}", &prof_entry_members, "providers[1]", MEMB_UNKNOWN,
         "providers[1].archive.timeout", "timeout_ms"},
        {"{\"pricing\":{\"currency\":\"USD\",\"variants\":{\"keys\":[\"$.model\"],\"tables\":"
         "{\"gpt-image-1\":{\"per_output\":1,\"per_output_by\":{\"keys\":[],\"price\":{}}}}}}}",
         &prof_entry_members, "providers[0]", MEMB_UNKNOWN,
         "providers[0].pricing.variants.tables.gpt-image-1.per_output_by.price", "prices"},
        /* A variant's table: no currency of its own (the parent's applies). */
        {"{\"currency\":\"USD\",\"variants\":{\"tables\":{\"m\":{\"currency\":\"EUR\"}}}}",
         &price_table_members, "pricing", MEMB_UNKNOWN, "pricing.variants.tables.m.currency",
         NULL},
        /* A profile file holds no "name" or "profile": only an entry does. */
        {"{\"name\":\"a\"}", prof_entry_members.also, "", MEMB_UNKNOWN, "name", NULL},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        cJSON *doc = cJSON_Parse(rows[i].doc);
        if (!doc)
            fail_msg("row %zu: not JSON", i);
        struct memb_problem p;
        int rc = memb_check(doc, rows[i].table, rows[i].prefix, &p);
        cJSON_Delete(doc);
        if ((rc == 0) != (rows[i].kind == MEMB_OK) || p.kind != rows[i].kind ||
            strcmp(p.path, rows[i].path) != 0 || (p.suggest == NULL) != (rows[i].suggest == NULL) ||
            (p.suggest && strcmp(p.suggest, rows[i].suggest) != 0))
            fail_msg("row %zu: rc %d kind %d path \"%s\" suggest %s", i, rc, (int)p.kind, p.path,
                     p.suggest ? p.suggest : "(none)");
    }
}

static void test_message(void **state)
{
    (void)state;
    char buf[200];
    struct memb_problem p = {MEMB_UNKNOWN, "providers[2].timeout", "timeouts"};
    memb_message(&p, buf, sizeof(buf));
    assert_string_equal(buf, "unknown member providers[2].timeout (did you mean \"timeouts\"?)");
    p.suggest = NULL;
    memb_message(&p, buf, sizeof(buf));
    assert_string_equal(buf, "unknown member providers[2].timeout");
    struct memb_problem d = {MEMB_DUPLICATE, "retry", NULL};
    memb_message(&d, buf, sizeof(buf));
    assert_string_equal(buf, "duplicate member retry");
}

/* prof_load_all refuses an unknown member of an entry before it reads anything, naming the
 * configuration file, the path and the nearest name. */
static void test_prof_load_all_refuses(void **state)
{
    (void)state;
    static const struct {
        const char *providers;
        const char *want; /* NULL: loads */
    } rows[] = {
        {"[{\"name\":\"a\",\"base_url\":\"http://x\",\"routes\":[{\"route\":\"r\",\"path\":\"/r\"}]}]",
         NULL},
        {"[{\"name\":\"a\",\"base_url\":\"http://x\",\"routes\":[{\"route\":\"r\",\"path\":\"/r\"}]},"
         "{\"name\":\"b\",\"base_url\":\"http://x\",\"timeout\":{\"total_ms\":1},"
         "\"routes\":[{\"route\":\"r\",\"path\":\"/r\"}]}]",
         "t.json: unknown member providers[1].timeout (did you mean \"timeouts\"?)"},
        /* Before the missing name is noticed. */
        {"[{\"nmae\":\"a\"}]", "t.json: unknown member providers[0].nmae (did you mean \"name\"?)"},
        {"[{\"name\":\"a\",\"base_url\":\"http://x\",\"routes\":[{\"route\":\"r\",\"path\":\"/r\"}],"
         "\"retry\":{\"max_attempts\":3,\"max_attempts\":9}}]",
         "t.json: duplicate member providers[0].retry.max_attempts"},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        cJSON *arr = cJSON_Parse(rows[i].providers);
        assert_non_null(arr);
        struct cfg_provider *ps = NULL;
        size_t n = 0;
        char err[512] = "";
        int rc = prof_load_all(arr, "t.json", ".", &ps, &n, err, sizeof(err));
        if (ps)
            prof_free_all(ps, n);
        cJSON_Delete(arr);
        if (!rows[i].want && rc != 0)
            fail_msg("row %zu: refused: %s", i, err);
        if (rows[i].want && (rc == 0 || strcmp(err, rows[i].want) != 0))
            fail_msg("row %zu: rc %d, err \"%s\"", i, rc, err);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distance),
        cmocka_unit_test(test_nearest),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_message),
        cmocka_unit_test(test_prof_load_all_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
