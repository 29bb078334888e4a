/* libFuzzer harness: JSONPath (src/jpath.c), the language profiles use to say where a value lives
 * in a provider's answer and in a client's body.
 *
 * Input: the first line is the path, the rest a JSON document. Properties checked:
 * - a refused path sets *out to NULL and says why, with an offset inside the text;
 * - jpath_first is the first node jpath_each visits, and jpath_string is its string or NULL;
 * - over a document both cJSON and the strict parser (jcs) accept, without wildcards (the two
 *   trees order members differently) and without \u0000 in it (cJSON cuts names there), the
 *   path selects a node of the same kind in both trees (jpath_first_in via reqbody). */
#include "fuzz.h"

#include "idemgate/jcs.h"
#include "idemgate/jpath.h"
#include "idemgate/reqbody.h"

#include <cjson/cJSON.h>

struct each {
    const cJSON *first;
    size_t n;
};

static void on_node(const cJSON *node, void *arg)
{
    struct each *e = arg;
    if (e->n++ == 0)
        e->first = node;
}

/* cJSON's kind of node as jcs's type, for comparison. */
static enum jcs_type kind_of(const cJSON *n)
{
    if (cJSON_IsNull(n))
        return JCS_NULL;
    if (cJSON_IsFalse(n))
        return JCS_FALSE;
    if (cJSON_IsTrue(n))
        return JCS_TRUE;
    if (cJSON_IsNumber(n))
        return JCS_NUMBER;
    if (cJSON_IsString(n))
        return JCS_STRING;
    return cJSON_IsArray(n) ? JCS_ARRAY : JCS_OBJECT;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz_parts in;
    fz_split(data, size, 2, &in);
    struct jpath *p = (struct jpath *)1;
    const char *err = NULL;
    if (jpath_compile(in.part[0], &p, &err) != 0) {
        FZ_CHECK(p == NULL && err != NULL, "a refusal says why");
        fz_parts_free(&in);
        return 0;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(in.part[1], in.len[1], &end, 0);
    const cJSON *first = jpath_first(p, root);
    struct each e = {NULL, 0};
    size_t n = jpath_each(p, root, on_node, &e);
    FZ_CHECK(n == e.n, "jpath_each counts what it visits");
    FZ_CHECK(first == e.first, "jpath_first is the first node jpath_each visits");
    FZ_CHECK((n == 0) == (first == NULL), "something selected iff a first node");
    const char *s = jpath_string(p, root);
    FZ_CHECK(s == (cJSON_IsString(first) ? first->valuestring : NULL), "jpath_string");

    struct jcs_doc *doc = NULL;
    int whole = root && end && (size_t)(end - in.part[1]) == in.len[1];
    if (whole && !strchr(in.part[0], '*') && !strstr(in.part[1], "\\u0000") &&
        jcs_parse(in.part[1], in.len[1], 64, &doc, NULL) == 0) {
        const struct jcs_node *j = reqbody_path_first(p, doc);
        FZ_CHECK((j == NULL) == (first == NULL), "both trees select a node, or neither");
        if (j)
            FZ_CHECK(jcs_node_type(j) == kind_of(first), "the same kind of node");
        jcs_doc_free(doc);
    }
    cJSON_Delete(root);
    jpath_free(p);
    fz_parts_free(&in);
    return 0;
}
