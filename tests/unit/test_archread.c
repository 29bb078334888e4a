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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_archread_classify),
        cmocka_unit_test(test_archready_stale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
