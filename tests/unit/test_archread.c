/* Archive across replicas (issue 21 item 13): why an archived object this replica cannot open
 * is answered as it is (archread_classify), and how long the archive's writability verdict is
 * trusted (archready_stale). Table-driven. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "idemgate/archread.h"
#include "idemgate/archready.h"
#include "idemgate/blobstore.h"

struct row {
    int rc;
    const char *backend, *stored_by, *mine, *me;
    enum archread_verdict want;
};

static const struct row rows[] = {
    /* Another replica's local folder: the object is not here. */
    {BLOB_ENOENT, "local", "gw-a", "local", "gw-b", ARCHREAD_OTHER_REPLICA},
    /* Archived before stored_by was recorded: whose it is cannot be told, not ours for sure. */
    {BLOB_ENOENT, "local", NULL, "local", "gw-b", ARCHREAD_OTHER_REPLICA},
    /* Another replica's bucket (replicas configured with different buckets). */
    {BLOB_ENOENT, "s3", "gw-a", "s3", "gw-b", ARCHREAD_OTHER_REPLICA},
    /* Our own object, gone from our own store. */
    {BLOB_ENOENT, "local", "gw-b", "local", "gw-b", ARCHREAD_LOST},
    {BLOB_ENOENT, "s3", "gw-b", "s3", "gw-b", ARCHREAD_LOST},
    /* Published to a store of another kind. */
    {BLOB_ENOENT, "s3", "gw-a", "local", "gw-b", ARCHREAD_OTHER_STORE},
    {BLOB_EUNAVAIL, "local", "gw-a", "s3", "gw-b", ARCHREAD_OTHER_STORE},
    {BLOB_ENOENT, NULL, NULL, "s3", "gw-b", ARCHREAD_OTHER_STORE},
    /* The store did not answer: whoever published it, try again. */
    {BLOB_EUNAVAIL, "s3", "gw-a", "s3", "gw-b", ARCHREAD_UNAVAILABLE},
    {BLOB_EUNAVAIL, "local", "gw-b", "local", "gw-b", ARCHREAD_UNAVAILABLE},
};

/* Whose temporary archive file a sweep finds (blob_tmp_owner): a container's pid 1 restarted
 * left files under its own pid, which the sweep skipped for ever as its own. */
static void test_tmp_owner(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        enum blob_tmp_owner want;
        long pid;
    } owners[] = {
        {"gw-a.1.18c0ffee.7", BLOB_TMP_OURS, 1},
        {"gw-a.1.18c0ffe.7", BLOB_TMP_EARLIER_RUN, 1},  /* a prefix of our run is not it */
        {"gw-a.1.18c0ffee0.7", BLOB_TMP_EARLIER_RUN, 1}, /* nor a longer one */
        {"gw-a.1.7", BLOB_TMP_EARLIER_RUN, 1},          /* an older name under our pid */
        {"gw-a.1.", BLOB_TMP_EARLIER_RUN, 1},
        {"gw-a.42.18c0ffee.7", BLOB_TMP_OTHER_PID, 42},
        {"gw-a.42.7", BLOB_TMP_OTHER_PID, 42},
        {"gw-ab.1.18c0ffee.7", BLOB_TMP_OTHER_HOST, 0}, /* another host, a longer name */
        {"gw-b.1.18c0ffee.7", BLOB_TMP_OTHER_HOST, 0},
        {"gw-a", BLOB_TMP_OTHER_HOST, 0},
        {"gw-a.x.7", BLOB_TMP_OTHER_HOST, 0},
        {"gw-a.0.7", BLOB_TMP_OTHER_HOST, 0},
        {"gw-a.-3.7", BLOB_TMP_OTHER_HOST, 0},
        {"gw-a.1", BLOB_TMP_OTHER_HOST, 0},
        {".", BLOB_TMP_OTHER_HOST, 0},
    };
    for (size_t i = 0; i < sizeof(owners) / sizeof(owners[0]); i++) {
        long pid = -1;
        print_message("%s\n", owners[i].name);
        assert_int_equal(blob_tmp_owner(owners[i].name, "gw-a", 1, "18c0ffee", &pid), owners[i].want);
        if (owners[i].want == BLOB_TMP_OTHER_PID)
            assert_int_equal(pid, owners[i].pid);
    }
}

static void test_archread_classify(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const struct row *t = &rows[i];
        enum archread_verdict got =
            archread_classify(t->rc, t->backend, t->stored_by, t->mine, t->me);
        if (got != t->want)
            fail_msg("row %zu: got %d, want %d", i, (int)got, (int)t->want);
    }
}

static void test_archready_stale(void **state)
{
    (void)state;
    assert_true(archready_stale(-1)); /* never probed */
    assert_false(archready_stale(0));
    assert_false(archready_stale(ARCHREADY_TTL_MS - 1));
    assert_true(archready_stale(ARCHREADY_TTL_MS));
    assert_true(archready_stale(3600 * 1000LL));
}

/* Bucket reads at once: the setting, never every database worker, never none. */
static void test_archread_s3_room(void **state)
{
    (void)state;
    static const struct {
        int reads_max, db_workers, want;
    } room[] = {
        {2, 4, 2}, {8, 4, 3}, {3, 4, 3}, {2, 2, 1}, {1, 1, 1}, {5, 1, 5}, /* one worker: all */
        {1, 256, 1}, {256, 256, 255},
    };
    for (size_t i = 0; i < sizeof(room) / sizeof(room[0]); i++) {
        int got = archread_s3_room(room[i].reads_max, room[i].db_workers);
        if (got != room[i].want)
            fail_msg("row %zu: %d, want %d", i, got, room[i].want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_archread_s3_room),
        cmocka_unit_test(test_tmp_owner),
        cmocka_unit_test(test_archread_classify),
        cmocka_unit_test(test_archready_stale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
