/* The local object store: a copy is published under its SHA-256, read back whole, and published
 * again after its object folder was removed by hand (the store remembers the folders it made
 * durable, and makes one again when it is gone). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "idemgate/blobstore.h"
#include "idemgate/config.h"

static int publish(struct blob_store *b, const char *text, char sha[65], int *existed)
{
    struct blob_tmp t;
    char why[256];
    if (blob_tmp_open(b, &t, why, sizeof(why)) < 0)
        fail_msg("open: %s", why);
    assert_int_equal(blob_tmp_write(&t, text, strlen(text)), 0);
    int rc = blob_tmp_commit(b, &t, "text/plain", sha, existed, why, sizeof(why));
    if (rc < 0)
        fail_msg("commit: %s", why);
    return rc;
}

static void read_back(struct blob_store *b, const char *sha, const char *text)
{
    int fd = -1;
    long long size = 0;
    char why[256], buf[64] = {0};
    if (blob_open_read(b, sha, &fd, &size, why, sizeof(why)) < 0)
        fail_msg("read: %s", why);
    assert_int_equal(size, (long long)strlen(text));
    assert_int_equal(read(fd, buf, sizeof(buf) - 1), (ssize_t)strlen(text));
    assert_string_equal(buf, text);
    close(fd);
}

static void test_a_removed_object_folder_is_made_again(void **state)
{
    (void)state;
    char root[] = "/tmp/idemgate-blob-XXXXXX";
    assert_non_null(mkdtemp(root));
    struct cfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.archive_backend = "local";
    cfg.archive_dir = root;
    cfg.archive_s3_endpoint = cfg.archive_s3_bucket = "";
    cfg.archive_s3_access_key_env = cfg.archive_s3_secret_key_env = "";
    cfg.archive_s3_region = "us-east-1";
    struct blob_store *b = blob_open(&cfg);
    assert_non_null(b);
    char sha[65], again[65], cmd[600];
    int existed = -1;
    assert_int_equal(publish(b, "first copy", sha, &existed), 0);
    assert_int_equal(existed, 0);
    read_back(b, sha, "first copy");
    assert_int_equal(publish(b, "first copy", again, &existed), 0);
    assert_int_equal(existed, 1); /* content-addressed: nothing written twice */
    assert_string_equal(sha, again);
    /* Its folder removed by hand while the store is open: the same bytes are published again. */
    snprintf(cmd, sizeof(cmd), "rm -rf '%s/objects/%.2s'", root, sha);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(publish(b, "first copy", again, &existed), 0);
    assert_int_equal(existed, 0);
    read_back(b, sha, "first copy");
    /* And the whole objects folder. */
    snprintf(cmd, sizeof(cmd), "rm -rf '%s/objects'", root);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(publish(b, "first copy", again, &existed), 0);
    read_back(b, sha, "first copy");
    blob_close(b);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_removed_object_folder_is_made_again),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
