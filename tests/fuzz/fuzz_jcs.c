/* libFuzzer harness: the RFC 8785 canonicaliser (src/jcs.c) on a client's raw body.
 *
 * Properties checked on every input that parses:
 * - jcs_canonicalize and jcs_parse + jcs_doc_canonical agree (same result, same bytes, same
 *   error code and offset on refusal);
 * - the canonical form is a fixed point: it parses, and its canonical form is itself;
 * - the compacted bytes parse to the same canonical form, and hold no whitespace between tokens;
 * - navigation stays inside the document (every node reachable by index is readable). */
#include "fuzz.h"

#include "idemgate/jcs.h"

#define DEPTH 64

/* Walks every node by index, reading what each accessor offers; the sanitizers watch the reads.
 * Returns the number of nodes. */
static size_t walk(const struct jcs_doc *doc, const struct jcs_node *n, int depth)
{
    FZ_CHECK(depth <= DEPTH, "navigation deeper than the parse allowed");
    size_t nodes = 1, len = 0;
    double v;
    enum jcs_type t = jcs_node_type(n);
    FZ_CHECK((jcs_node_number(doc, n, &v) == 0) == (t == JCS_NUMBER), "number accessor");
    FZ_CHECK((jcs_node_string(doc, n, &len) != NULL) == (t == JCS_STRING), "string accessor");
    size_t count = jcs_node_count(n);
    FZ_CHECK(count == 0 || t == JCS_ARRAY || t == JCS_OBJECT, "count of a scalar");
    for (size_t i = 0; i < count; i++) {
        const struct jcs_node *c = jcs_node_at(doc, n, i);
        FZ_CHECK(c != NULL, "child inside count");
        nodes += walk(doc, c, depth + 1);
    }
    FZ_CHECK(jcs_node_at(doc, n, count) == NULL, "child past count");
    return nodes;
}

/* 1 when s[0..len) has a space, tab, CR or LF outside strings. */
static int has_ws_between_tokens(const char *s, size_t len)
{
    int in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
            return 1;
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size copy: the parser must not read past len (the input is not NUL-terminated). */
    char *in = malloc(size ? size : 1);
    if (!in)
        return 0;
    if (size)
        memcpy(in, data, size);

    char *canon = NULL, *canon2 = NULL, *again = NULL, *compact = NULL;
    size_t canon_len = 0, canon2_len = 0, again_len = 0, compact_len = 0;
    struct jcs_error e1 = {0}, e2 = {0};
    struct jcs_doc *doc = NULL, *doc2 = NULL;

    int rc1 = jcs_canonicalize(in, size, DEPTH, &canon, &canon_len, &e1);
    int rc2 = jcs_parse(in, size, DEPTH, &doc, &e2);
    FZ_CHECK(rc1 == rc2, "jcs_canonicalize and jcs_parse agree on acceptance");
    if (rc1 != 0) {
        FZ_CHECK(canon == NULL && doc == NULL, "nothing returned on failure");
        FZ_CHECK(e1.code == e2.code && e1.offset == e2.offset, "same error, same offset");
        FZ_CHECK(e1.offset <= size, "error offset inside the input");
        FZ_CHECK(e1.what != NULL && jcs_strerror(e1.code) != NULL, "error described");
        goto done;
    }
    FZ_CHECK(canon[canon_len] == '\0', "canonical form NUL-terminated");
    FZ_CHECK(memchr(canon, '\0', canon_len) == NULL, "control characters escaped");
    FZ_CHECK(jcs_doc_canonical(doc, &canon2, &canon2_len) == 0, "canonical form of the doc");
    FZ_CHECK(canon2_len == canon_len && memcmp(canon, canon2, canon_len) == 0,
             "one canonical form however it is asked for");
    FZ_CHECK(!has_ws_between_tokens(canon, canon_len), "no whitespace in the canonical form");

    /* Idempotence: the canonical form is canonical. */
    FZ_CHECK(jcs_canonicalize(canon, canon_len, DEPTH, &again, &again_len, NULL) == 0,
             "the canonical form parses");
    FZ_CHECK(again_len == canon_len && memcmp(again, canon, canon_len) == 0,
             "canonicalising the canonical form changes nothing");
    free(again);
    again = NULL;

    /* The compacted bytes mean the same document. */
    compact = jcs_doc_take_compact(doc, &compact_len);
    FZ_CHECK(compact != NULL && compact[compact_len] == '\0', "compact bytes handed over");
    FZ_CHECK(compact_len <= size, "compacting never grows the body");
    FZ_CHECK(!has_ws_between_tokens(compact, compact_len), "no whitespace between tokens");
    size_t dummy = 1;
    FZ_CHECK(jcs_doc_take_compact(doc, &dummy) == NULL && dummy == 0, "compact taken once");
    FZ_CHECK(jcs_parse(compact, compact_len, DEPTH, &doc2, NULL) == 0, "the compact form parses");
    FZ_CHECK(jcs_doc_canonical(doc2, &again, &again_len) == 0, "canonical of the compact form");
    FZ_CHECK(again_len == canon_len && memcmp(again, canon, canon_len) == 0,
             "compact and original share a canonical form");

    walk(doc, jcs_doc_root(doc), 1);

done:
    jcs_doc_free(doc);
    jcs_doc_free(doc2);
    free(canon);
    free(canon2);
    free(again);
    free(compact);
    free(in);
    return 0;
}
