/* libFuzzer harness: the intake's one pass over a client's body (src/reqbody.c), with the
 * independent scanners of src/inject.c as the reference.
 *
 * The first input byte picks what the provider profile wants (the client reference field and
 * where the count of outputs is); the rest is the body. Properties checked:
 * - reqbody_init accepts exactly what jcs_canonicalize accepts, with the same canonical form;
 * - its compacted bytes are what inject_compact makes of the same body;
 * - its placeability verdict is what inject_check says on those bytes, and when it says the
 *   reference fits, inject_member places it and the result is still a valid body;
 * - the outputs asked for are in 1..1000, the default, or -1 when not counted. */
#include "fuzz.h"

#include "idemgate/inject.h"
#include "idemgate/jcs.h"
#include "idemgate/jpath.h"
#include "idemgate/reqbody.h"

#define DEPTH 32

static const char *const fields[] = {NULL, "client_ref", "metadata.client_ref", "input.webhook",
                                     "a.b.c", ""};
static const char *const paths[] = {NULL, "$.n", "$.num_outputs", "$.input.num_outputs",
                                    "$.*.n", "$['sample count']", "$.items[-1]", "$[*][0]"};
static struct jpath *compiled[sizeof(paths) / sizeof(paths[0])];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    for (size_t i = 1; i < sizeof(paths) / sizeof(paths[0]); i++)
        if (jpath_compile(paths[i], &compiled[i], NULL) != 0)
            abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t sel = data[0];
    const char *field = fields[sel % (sizeof(fields) / sizeof(fields[0]))];
    size_t pi = (size_t)(sel >> 3) % (sizeof(paths) / sizeof(paths[0]));
    struct reqbody_needs needs = {.max_depth = DEPTH,
                                  .client_ref_field = field,
                                  .outputs_path = compiled[pi],
                                  .outputs_default = 1 + (sel >> 6),
                                  .outputs_counted = (sel & 0x4) != 0};
    size_t len = size - 1;
    char *in = malloc(len ? len : 1); /* exact size: not NUL-terminated */
    if (!in)
        return 0;
    if (len)
        memcpy(in, data + 1, len);

    struct reqbody b;
    struct jcs_error err = {0};
    char *canon = NULL, *compact = NULL, *placed = NULL;
    size_t canon_len = 0, compact_len = 0, placed_len = 0;
    int rc = reqbody_init(&b, in, len, &needs, &err);
    int ref = jcs_canonicalize(in, len, DEPTH, &canon, &canon_len, NULL);
    FZ_CHECK(rc == ref, "reqbody_init accepts what jcs_canonicalize accepts");
    if (rc != 0) {
        FZ_CHECK(b.canon == NULL && b.sent == NULL && b.requested == -1, "nothing on failure");
        goto done;
    }
    FZ_CHECK(b.canon_len == canon_len && memcmp(b.canon, canon, canon_len) == 0,
             "the fingerprinted form is the canonical form");
    FZ_CHECK(inject_compact(in, len, &compact, &compact_len) == 0, "inject_compact");
    FZ_CHECK(b.sent_len == compact_len && memcmp(b.sent, compact, compact_len) == 0,
             "the stored bytes are the body compacted");
    int check = field ? inject_check(b.sent, b.sent_len, field) : INJECT_OK;
    FZ_CHECK(b.placeable == check, "placeability is inject_check's verdict");
    if (field && b.placeable == INJECT_OK) {
        FZ_CHECK(inject_member(b.sent, b.sent_len, field, "ref-1", &placed, &placed_len) == 0,
                 "a placeable reference is placed");
        struct jcs_doc *d = NULL;
        FZ_CHECK(jcs_parse(placed, placed_len, DEPTH + 1, &d, NULL) == 0,
                 "the body with the reference is still valid JSON");
        jcs_doc_free(d);
    }
    if (!needs.outputs_counted)
        FZ_CHECK(b.requested == -1, "not counted");
    else
        FZ_CHECK((b.requested >= 1 && b.requested <= 1000) || b.requested == needs.outputs_default,
                 "outputs asked for in range");
    reqbody_fini(&b);
done:
    free(canon);
    free(compact);
    free(placed);
    free(in);
    return 0;
}
