/* The ledger's decisions: price tables (estimate at intake, cost at completion, partial results,
 * seconds, tokens, saturation), amounts, the usage query, and the retention sweep's plan. One
 * table row per case. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemgate/multipart.h"
#include "idemgate/pricing.h"
#include "idemgate/upload.h"
#include "idemgate/retention.h"
#include "idemgate/usage.h"

#define N_ROWS(a) (sizeof(a) / sizeof((a)[0]))

/* Price tables, as a profile's "pricing" member. */
static const char *const IMAGES =
    "{\"currency\":\"USD\",\"per_output\":40000,"
    "\"per_output_by\":{\"keys\":[\"$.quality\",\"$.size\"],\"defaults\":[\"medium\","
    "\"1024x1024\"],\"prices\":{\"low|1024x1024\":11000,\"medium|1024x1024\":42000,"
    "\"high|1024x1024\":167000,\"high|1536x1024\":250000}}}";
static const char *const VIDEO =
    "{\"currency\":\"USD\",\"per_second\":100000,\"seconds\":\"$.seconds\","
    "\"default_seconds\":4}";
static const char *const TOKENS =
    "{\"currency\":\"USD\",\"per_request\":1000,\"per_million_input_tokens\":5000000,"
    "\"per_million_output_tokens\":40000000,\"input_tokens\":\"$.input_tokens\","
    "\"output_tokens\":\"$.output_tokens\",\"estimate_input_tokens\":100,"
    "\"estimate_output_tokens\":1000}";
/* The same, reserving the request's max_tokens of output (an LLM). */
static const char *const LLM =
    "{\"currency\":\"USD\",\"per_request\":1000,\"per_million_input_tokens\":5000000,"
    "\"per_million_output_tokens\":40000000,\"input_tokens\":\"$.input_tokens\","
    "\"output_tokens\":\"$.output_tokens\",\"estimate_input_tokens\":100,"
    "\"estimate_output_tokens\":1000,\"output_tokens_requested\":\"$.max_tokens\"}";
/* Per second by model and size (a video API); the fallback for a pair the table lacks. */
static const char *const VIDEO_BY =
    "{\"currency\":\"USD\",\"per_second\":100000,\"seconds\":\"$.seconds\","
    "\"default_seconds\":4,\"per_second_by\":{\"keys\":[\"$.model\",\"$.size\"],"
    "\"defaults\":[\"sora-2\",\"720x1280\"],\"prices\":{\"sora-2-pro|720x1280\":300000,"
    "\"sora-2-pro|1024x1792\":500000}}}";
/* Billed by tokens, per-image figures for the estimate (usage_settles). */
static const char *const IMAGE_TOKENS =
    "{\"currency\":\"USD\",\"usage_settles\":true,\"per_million_input_tokens\":5000000,"
    "\"per_million_output_tokens\":40000000,\"input_tokens\":\"$.input_tokens\","
    "\"output_tokens\":\"$.output_tokens\",\"per_output\":42000,"
    "\"per_output_by\":{\"keys\":[\"$.quality\"],\"defaults\":[\"medium\"],"
    "\"prices\":{\"high\":167000}}}";
/* An LLM billed by tokens alone, settled by the usage (openai-chat's tables). */
static const char *const CHAT_SETTLES =
    "{\"currency\":\"USD\",\"usage_settles\":true,\"per_million_input_tokens\":150000,"
    "\"per_million_output_tokens\":600000,\"input_tokens\":\"$.prompt_tokens\","
    "\"output_tokens\":\"$.completion_tokens\",\"estimate_input_tokens\":1000,"
    "\"estimate_output_tokens\":1000,\"output_tokens_requested\":\"$.max_tokens\"}";
/* The bound under either of its names, times the completions asked for (OpenAI Chat). */
static const char *const CHAT_CHOICES =
    "{\"currency\":\"USD\",\"usage_settles\":true,\"per_million_input_tokens\":150000,"
    "\"per_million_output_tokens\":600000,\"input_tokens\":\"$.prompt_tokens\","
    "\"output_tokens\":\"$.completion_tokens\",\"estimate_input_tokens\":1000,"
    "\"estimate_output_tokens\":1000,\"output_tokens_requested\":[\"$.max_completion_tokens\","
    "\"$.max_tokens\"],\"choices_requested\":\"$.n\"}";
/* A whole table per model; a model no variant names is priced by the top-level members. */
static const char *const MODELS =
    "{\"currency\":\"USD\",\"per_output\":20000,\"variants\":{\"keys\":[\"$.model\"],"
    "\"defaults\":[\"dall-e-2\"],\"tables\":{"
    "\"gpt-image-1-mini\":{\"per_output\":36000,\"per_output_by\":{\"keys\":[\"$.quality\"],"
    "\"defaults\":[\"auto\"],\"prices\":{\"low\":5000,\"high\":36000}},\"usage_settles\":true,"
    "\"per_million_input_tokens\":2000000,\"per_million_output_tokens\":8000000,"
    "\"input_tokens\":\"$.input_tokens\",\"output_tokens\":\"$.output_tokens\"},"
    "\"dall-e-3\":{\"per_output\":40000}}}}";
/* Per megapixel of a custom size, rounded up; named sizes by the per-output table. */
static const char *const MEGAPIXELS =
    "{\"currency\":\"USD\",\"per_output\":25000,\"per_output_by\":{\"keys\":[\"$.image_size\"],"
    "\"defaults\":[\"landscape_4_3\"],\"prices\":{\"square_hd\":50000}},\"per_megapixel\":25000,"
    "\"width\":\"$.image_size.width\",\"height\":\"$.image_size.height\"}";
static const char *const FLAT = "{\"currency\":\"EUR\",\"per_request\":250000}";

struct price_case {
    const char *table;
    const char *body;  /* the request */
    int requested;     /* outputs asked for (-1: not counted) */
    int received;      /* outputs delivered (-1: not counted) */
    const char *usage; /* the recorded usage, or NULL */
    long long estimate, actual;
};

static const struct price_case price_cases[] = {
    /* Per image by quality and size; defaults fill what the request leaves out. */
    {IMAGES, "{\"n\":2,\"quality\":\"high\",\"size\":\"1024x1024\"}", 2, 2, NULL, 334000, 334000},
    {IMAGES, "{\"n\":1,\"quality\":\"low\"}", 1, 1, NULL, 11000, 11000},
    {IMAGES, "{}", 1, 1, NULL, 42000, 42000},
    /* A combination the table lacks costs per_output. */
    {IMAGES, "{\"quality\":\"ultra\"}", 1, 1, NULL, 40000, 40000},
    {IMAGES, "{\"quality\":\"high\",\"size\":\"1536x1024\"}", 3, 3, NULL, 750000, 750000},
    /* Partial: three asked, one delivered; the provider charges for what it delivered. */
    {IMAGES, "{\"quality\":\"high\",\"size\":\"1024x1024\"}", 3, 1, NULL, 501000, 167000},
    {IMAGES, "{\"quality\":\"high\",\"size\":\"1024x1024\"}", 3, 0, NULL, 501000, 0},
    /* Not counted: the request's count, then one. */
    {IMAGES, "{}", -1, -1, NULL, 42000, 42000},
    {IMAGES, "{}", 4, -1, NULL, 168000, 168000},
    /* A body that does not parse knows no request values. */
    {IMAGES, "not json", 1, 1, NULL, 42000, 42000},
    /* Seconds of video: a number, a string holding one, the default, refused values. */
    {VIDEO, "{\"seconds\":8}", 1, 1, NULL, 800000, 800000},
    {VIDEO, "{\"seconds\":\"12\"}", 1, 1, NULL, 1200000, 1200000},
    {VIDEO, "{}", 1, 1, NULL, 400000, 400000},
    {VIDEO, "{\"seconds\":\"8s\"}", 1, 1, NULL, 400000, 400000},
    {VIDEO, "{\"seconds\":-8}", 1, 1, NULL, 400000, 400000},
    {VIDEO, "{\"seconds\":2.5}", 2, 1, NULL, 500000, 250000},
    /* Per second by request values; the defaults name sora-2 at 720x1280, priced per_second. */
    {VIDEO_BY, "{\"model\":\"sora-2-pro\",\"seconds\":\"8\",\"size\":\"1024x1792\"}", 1, 1,
     NULL, 4000000, 4000000},
    {VIDEO_BY, "{\"model\":\"sora-2-pro\",\"seconds\":\"4\"}", 1, 1, NULL, 1200000, 1200000},
    {VIDEO_BY, "{\"seconds\":12}", 1, 1, NULL, 1200000, 1200000},
    {VIDEO_BY, "{\"model\":\"sora-2\",\"size\":\"1024x1792\"}", 1, 1, NULL, 400000, 400000},
    {VIDEO_BY, "{\"model\":\"sora-2-pro\",\"size\":\"1024x1792\"}", 2, 0, NULL, 4000000, 0},
    /* Estimated per image, settled by the tokens the usage reports; the per-image figure when it
     * reports none. 272 output tokens at $40/M + 20 input at $5/M = 0.01098. */
    {IMAGE_TOKENS, "{\"quality\":\"high\",\"n\":2}", 2, 2,
     "{\"input_tokens\":20,\"output_tokens\":272}", 334000, 10980},
    {IMAGE_TOKENS, "{}", 1, 1, "{\"input_tokens\":0,\"output_tokens\":4160}", 42000, 166400},
    {IMAGE_TOKENS, "{\"quality\":\"high\"}", 1, 1, NULL, 167000, 167000},
    {IMAGE_TOKENS, "{\"quality\":\"high\"}", 1, 1, "{\"total\":1}", 167000, 167000},
    {IMAGE_TOKENS, "{\"quality\":\"high\"}", 3, 1, NULL, 501000, 167000},
    /* Variants by model: its own table, token rates and settlement; the top level otherwise.
     * 10 input tokens at $2/M + 272 output at $8/M = 0.002196. */
    {MODELS, "{\"model\":\"gpt-image-1-mini\",\"quality\":\"low\"}", 1, 1,
     "{\"input_tokens\":10,\"output_tokens\":272}", 5000, 2196},
    {MODELS, "{\"model\":\"gpt-image-1-mini\"}", 1, 1, NULL, 36000, 36000},
    {MODELS, "{\"model\":\"dall-e-3\",\"n\":2}", 2, 2, NULL, 80000, 80000},
    {MODELS, "{}", 1, 1, NULL, 20000, 20000},
    {MODELS, "{\"model\":\"gpt-image-9\"}", 1, 1, "{\"output_tokens\":5}", 20000, 20000},
    /* Megapixels: named sizes from the table, custom ones rounded up to whole megapixels. */
    {MEGAPIXELS, "{\"image_size\":\"square_hd\"}", 2, 2, NULL, 100000, 100000},
    {MEGAPIXELS, "{}", 1, 1, NULL, 25000, 25000},
    {MEGAPIXELS, "{\"image_size\":{\"width\":1024,\"height\":1024}}", 1, 1, NULL, 50000, 50000},
    {MEGAPIXELS, "{\"image_size\":{\"width\":1000,\"height\":1000}}", 1, 1, NULL, 25000, 25000},
    {MEGAPIXELS, "{\"image_size\":{\"width\":2000,\"height\":3000}}", 2, 1, NULL, 300000, 150000},
    {MEGAPIXELS, "{\"image_size\":{\"width\":1000}}", 1, 1, NULL, 25000, 25000},
    /* Tokens: estimated at intake, from the usage at completion, the estimate when it has none. */
    {TOKENS, "{}", 1, 1, "{\"input_tokens\":10,\"output_tokens\":100}", 41500, 5050},
    {TOKENS, "{}", 1, 1, "{\"input_tokens\":1000000,\"output_tokens\":0}", 41500, 5001000},
    {TOKENS, "{}", 1, 1, NULL, 41500, 41500},
    {TOKENS, "{}", 1, 1, "{\"total_tokens\":5}", 41500, 41500},
    /* An LLM's max_tokens is the most output it may be billed: what its estimate reserves.
     * 100 input tokens at $5/M + 64 output at $40/M + 1000 per request = 4060. */
    {LLM, "{\"max_tokens\":64}", -1, -1, NULL, 4060, 4060}, /* no usage: the bound */
    {LLM, "{\"max_tokens\":64}", -1, -1, "{\"input_tokens\":10,\"output_tokens\":5}", 4060,
     1250},
    {LLM, "{}", -1, -1, NULL, 41500, 41500},
    {LLM, "{\"max_tokens\":\"64\"}", -1, -1, NULL, 4060, 4060},
    {LLM, "{\"max_tokens\":-1}", -1, -1, NULL, 41500, 41500},
    /* Settled by the usage; an answer that reports none (a stream without include_usage)
     * settles at the estimate, never at 0: 1000 in at $0.15/M + 1000 out at $0.60/M = 750;
     * with max_tokens 100, 150 + 60 = 210. */
    {CHAT_SETTLES, "{}", -1, -1, NULL, 750, 750},
    {CHAT_SETTLES, "{\"max_tokens\":100}", -1, -1, NULL, 210, 210},
    {CHAT_SETTLES, "{}", -1, -1, "{\"prompt_tokens\":10,\"completion_tokens\":20}", 750, 14},
    /* The bound under either name (the first that holds a number), times the completions:
     * 1000 in at $0.15/M = 150, plus 100 out (200, 300, ...) at $0.60/M per completion. */
    {CHAT_CHOICES, "{\"max_tokens\":100}", -1, -1, NULL, 210, 210},
    {CHAT_CHOICES, "{\"max_completion_tokens\":100,\"max_tokens\":900}", -1, -1, NULL, 210,
     210},
    {CHAT_CHOICES, "{\"max_tokens\":100,\"n\":4}", -1, -1, NULL, 390, 390},
    {CHAT_CHOICES, "{\"n\":3}", -1, -1, NULL, 1950, 1950}, /* the estimate's 1000, three times */
    {CHAT_CHOICES, "{\"max_tokens\":100,\"n\":0}", -1, -1, NULL, 210, 210},
    {CHAT_CHOICES, "{\"max_tokens\":100,\"n\":129}", -1, -1, NULL, 210, 210},
    /* settled by the usage the answer reports, all completions in it */
    {CHAT_CHOICES, "{\"max_tokens\":100,\"n\":4}", -1, -1,
     "{\"prompt_tokens\":10,\"completion_tokens\":20}", 390, 14},
    /* Per request only, whatever the outputs. */
    {FLAT, "{\"n\":5}", 5, 2, NULL, 250000, 250000},
    /* Saturation instead of overflow. */
    {"{\"currency\":\"USD\",\"per_output\":1000000000000000000}", "{}", 1000, 1000, NULL,
     PRICE_JOB_MAX, PRICE_JOB_MAX},
    {"{\"currency\":\"USD\",\"per_output\":1000000000000000}", "{}", 1000, 1000, NULL,
     PRICE_JOB_MAX, PRICE_JOB_MAX},
};

static void test_prices(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ROWS(price_cases); i++) {
        const struct price_case *c = &price_cases[i];
        cJSON *j = cJSON_Parse(c->table);
        struct price_table t;
        char err[200] = "";
        assert_non_null(j);
        if (price_table_load(j, &t, err, sizeof(err)) < 0)
            fail_msg("row %zu: %s", i, err);
        long long est = price_estimate_raw(&t, c->body, strlen(c->body), c->requested);
        long long act = price_actual_raw(&t, c->body, strlen(c->body), c->requested, c->received,
                                         c->usage, NULL);
        if (est != c->estimate || act != c->actual)
            fail_msg("row %zu: estimate %lld (want %lld), actual %lld (want %lld)", i, est,
                     c->estimate, act, c->actual);
        price_table_fini(&t);
        cJSON_Delete(j);
    }
}

/* The shipped profiles' price tables (deploy/providers, read from the repository root, where
 * make unit runs): a figure mistyped or a key misspelt changes a row. */
struct shipped_case {
    const char *profile;
    const char *body;
    int requested, received;
    const char *usage;
    long long estimate, actual;
};

static const struct shipped_case shipped_cases[] = {
    /* OpenAI Chat, gpt-4o: the bound under its older name, two completions: 1000 in at $2.50/M
     * + 2 x 100 out at $10/M = 0.0045 (before: the estimate's 1000 out once, 0.0125). */
    {"openai-chat", "{\"model\":\"gpt-4o\",\"max_tokens\":100,\"n\":2}", -1, -1, NULL,
     4500, 4500},
    /* gpt-image-1: $0.167 estimated, settled by tokens: 20 in at $5/M + 4160 out at $40/M. */
    {"openai-images", "{\"model\":\"gpt-image-1\",\"quality\":\"high\",\"size\":\"1024x1024\"}",
     1, 1, "{\"input_tokens\":20,\"output_tokens\":4160}", 167000, 166500},
    /* Quality and size left to the provider ("auto"): the dearest image of the model. */
    {"openai-images", "{\"model\":\"gpt-image-1\"}", 1, 1, NULL, 250000, 250000},
    {"openai-images",
     "{\"model\":\"gpt-image-1-mini\",\"quality\":\"low\",\"size\":\"1024x1536\",\"n\":2}", 2,
     2, NULL, 12000, 12000},
    {"openai-images", "{\"model\":\"dall-e-3\",\"quality\":\"hd\",\"size\":\"1792x1024\"}", 1, 1,
     NULL, 120000, 120000},
    {"openai-images", "{\"size\":\"512x512\"}", 1, 1, NULL, 18000, 18000},
    /* No model: dall-e-2, unless a GPT image parameter is given (OpenAI's own default) — then
     * gpt-image-1 (variants.default_when). Ten high 1536x1024 images were priced as dall-e-2's
     * ten at its 1024x1024 default, $0.20 for up to $2.50. */
    {"openai-images", "{\"quality\":\"high\",\"size\":\"1536x1024\",\"n\":10}", 10, 10, NULL,
     2500000, 2500000},
    {"openai-images", "{\"background\":\"transparent\"}", 1, 1, NULL, 250000, 250000},
    {"openai-images", "{\"output_format\":null,\"size\":\"256x256\"}", 1, 1, NULL, 16000, 16000},
    {"openai-images", "{\"quality\":\"standard\",\"size\":\"1024x1024\"}", 1, 1, NULL, 20000,
     20000},
    {"openai-images", "{\"model\":\"dall-e-3\",\"quality\":\"high\"}", 1, 1, NULL, 120000,
     120000}, /* a model named: default_when does not apply */
    {"openai-images", "{\"model\":\"gpt-image-2\"}", 1, 1, NULL, 0, 0},
    {"openai-videos", "{\"model\":\"sora-2-pro\",\"size\":\"1792x1024\",\"seconds\":\"8\"}", 1, 1,
     NULL, 4000000, 4000000},
    {"openai-videos", "{\"prompt\":\"x\"}", 1, 1, NULL, 400000, 400000},
    {"replicate", "{\"input\":{\"num_outputs\":4}}", 4, 3, NULL, 12000, 9000},
    {"fal-queue", "{\"image_size\":\"square_hd\",\"num_images\":2}", 2, 2, NULL, 100000, 100000},
    {"fal-queue", "{\"image_size\":{\"width\":1536,\"height\":1536}}", 1, 1, NULL, 75000, 75000},
    {"fal-queue", "{}", 1, 1, NULL, 25000, 25000},
    {"runway", "{\"model\":\"gen4_turbo\",\"duration\":5}", 1, 1, NULL, 250000, 250000},
    {"runway", "{\"model\":\"gen4_turbo\"}", 1, 1, NULL, 500000, 500000},
    {"runway", "{\"model\":\"gen4_image\",\"ratio\":\"1920:1080\"}", 1, 1, NULL, 80000, 80000},
    {"runway", "{\"model\":\"gen4_image\",\"ratio\":\"1280:720\"}", 1, 1, NULL, 50000, 50000},
    {"runway", "{\"model\":\"gen4_image_turbo\"}", 1, 1, NULL, 20000, 20000},
};

static cJSON *read_profile(const char *name)
{
    char path[256];
    snprintf(path, sizeof(path), "deploy/providers/%s.json", name);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("%s: cannot open (run from the repository root)", path);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    if (!j)
        fail_msg("%s: not JSON", path);
    return j;
}

static void test_shipped_price_tables(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ROWS(shipped_cases); i++) {
        const struct shipped_case *c = &shipped_cases[i];
        cJSON *prof = read_profile(c->profile);
        const cJSON *pj = cJSON_GetObjectItemCaseSensitive(prof, "pricing");
        struct price_table t;
        char err[200] = "";
        if (!pj || price_table_load(pj, &t, err, sizeof(err)) < 0)
            fail_msg("row %zu (%s): %s", i, c->profile, pj ? err : "no pricing");
        assert_non_null(t.source);
        long long est = price_estimate_raw(&t, c->body, strlen(c->body), c->requested);
        long long act = price_actual_raw(&t, c->body, strlen(c->body), c->requested, c->received,
                                         c->usage, NULL);
        if (est != c->estimate || act != c->actual)
            fail_msg("row %zu (%s): estimate %lld (want %lld), actual %lld (want %lld)", i,
                     c->profile, est, c->estimate, act, c->actual);
        price_table_fini(&t);
        cJSON_Delete(prof);
    }
}

/* A multipart body is priced at its end by its text fields, as the intake estimated it — the
 * body as the client sent it and its stored form, the large part cut out (a review found both
 * priced at the table's defaults: sora-2-pro 1792x1024 for 8 s settled at sora-2's 4 s). */
static void test_multipart_bodies_are_priced_by_their_fields(void **state)
{
    (void)state;
    static const char body[] =
        "--b0undary\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nsora-2-pro\r\n"
        "--b0undary\r\nContent-Disposition: form-data; name=\"size\"\r\n\r\n1792x1024\r\n"
        "--b0undary\r\nContent-Disposition: form-data; name=\"seconds\"\r\n\r\n8\r\n"
        "--b0undary\r\nContent-Disposition: form-data; name=\"input_reference\"; "
        "filename=\"a.png\"\r\nContent-Type: image/png\r\n\r\n"
        "0123456789012345678901234567890123456789\r\n--b0undary--\r\n";
    size_t len = sizeof(body) - 1;
    cJSON *prof = read_profile("openai-videos");
    struct price_table t;
    char err[200] = "";
    assert_int_equal(price_table_load(cJSON_GetObjectItemCaseSensitive(prof, "pricing"), &t, err,
                                      sizeof(err)),
                     0);
    assert_int_equal(price_actual_raw(&t, body, len, 1, 1, NULL, NULL), 4000000);
    /* Its stored form: the file's content (over 16 bytes) cut out, to the archive store. */
    struct mp_part parts[MP_MAX_PARTS];
    size_t n = 0;
    char why[160];
    assert_int_equal(mp_parse(body, len, "b0undary", parts, MP_MAX_PARTS, &n, why, sizeof(why)), 0);
    unsigned char sel[MP_MAX_PARTS];
    assert_int_equal(upl_select(parts, n, 16, sel), 1);
    static const char sha[MP_MAX_PARTS][65] = {[3] = "0000000000000000000000000000000000000000"
                                                     "000000000000000000000000"};
    struct upl_ref refs[MP_MAX_PARTS];
    size_t nrefs = upl_refs_of(body, parts, n, sel, sha, refs);
    assert_int_equal(nrefs, 1);
    char *stored = NULL;
    size_t slen = 0;
    assert_int_equal(upl_store_form(body, len, refs, nrefs, &stored, &slen), 0);
    assert_true(upl_is_stored_form(stored, slen));
    assert_int_equal(price_actual_raw(&t, stored, slen, 1, 1, NULL, NULL), 4000000);
    free(stored);
    price_table_fini(&t);
    cJSON_Delete(prof);
}

/* A model a table with variants does not list, and no top-level price: unlisted (counted by
 * idemgate_unpriced_operations_total). */
static void test_unlisted_requests(void **state)
{
    (void)state;
    static const struct {
        const char *table, *body;
        int unlisted;
    } rows[] = {
        {"{\"currency\":\"USD\",\"variants\":{\"keys\":[\"$.model\"],\"tables\":{\"a\":"
         "{\"per_output\":5}}}}", "{\"model\":\"b\"}", 1},
        {"{\"currency\":\"USD\",\"variants\":{\"keys\":[\"$.model\"],\"tables\":{\"a\":"
         "{\"per_output\":5}}}}", "{\"model\":\"a\"}", 0},
        {"{\"currency\":\"USD\",\"variants\":{\"keys\":[\"$.model\"],\"tables\":{\"a\":"
         "{\"per_output\":5}}}}", "not json", 1},
        /* A top-level price prices every model the variants do not list. */
        {"{\"currency\":\"USD\",\"per_request\":1,\"variants\":{\"keys\":[\"$.model\"],"
         "\"tables\":{\"a\":{\"per_output\":5}}}}", "{\"model\":\"b\"}", 0},
        {"{\"currency\":\"USD\",\"per_output\":0}", "{\"model\":\"b\"}", 0},
        {NULL, "{}", 0},
        /* A price by request values that names none of the request's values, no flat price
         * beside it: that part of the cost would be 0 (a video model and size pair a
         * per_second_by does not list). */
        {"{\"currency\":\"USD\",\"seconds\":\"$.s\",\"per_second_by\":{\"keys\":[\"$.m\"],"
         "\"prices\":{\"a\":1}}}", "{\"m\":\"b\",\"s\":4}", 1},
        {"{\"currency\":\"USD\",\"seconds\":\"$.s\",\"per_second_by\":{\"keys\":[\"$.m\"],"
         "\"prices\":{\"a\":1}}}", "{\"m\":\"a\",\"s\":4}", 0},
        {"{\"currency\":\"USD\",\"seconds\":\"$.s\",\"per_second\":2,\"per_second_by\":"
         "{\"keys\":[\"$.m\"],\"prices\":{\"a\":1}}}", "{\"m\":\"b\",\"s\":4}", 0},
        {"{\"currency\":\"USD\",\"per_output_by\":{\"keys\":[\"$.q\"],\"prices\":{\"hi\":3}}}",
         "{\"q\":\"lo\"}", 1},
        {"{\"currency\":\"USD\",\"per_output\":2,\"per_output_by\":{\"keys\":[\"$.q\"],"
         "\"prices\":{\"hi\":3}}}", "{\"q\":\"lo\"}", 0},
        /* In a variant: the variant's own by-table. */
        {"{\"currency\":\"USD\",\"variants\":{\"keys\":[\"$.model\"],\"tables\":{\"a\":"
         "{\"per_output_by\":{\"keys\":[\"$.q\"],\"prices\":{\"hi\":3}}}}}}",
         "{\"model\":\"a\",\"q\":\"lo\"}", 1},
    };
    for (size_t i = 0; i < N_ROWS(rows); i++) {
        cJSON *j = rows[i].table ? cJSON_Parse(rows[i].table) : NULL;
        struct price_table t;
        char err[200] = "";
        assert_int_equal(price_table_load(j, &t, err, sizeof(err)), 0);
        if (price_unlisted_raw(&t, rows[i].body, strlen(rows[i].body)) != rows[i].unlisted)
            fail_msg("row %zu: unlisted should be %d", i, rows[i].unlisted);
        price_table_fini(&t);
        cJSON_Delete(j);
    }
    /* The shipped OpenAI images table does not list its successors. */
    cJSON *prof = read_profile("openai-images");
    struct price_table t;
    char err[200] = "";
    assert_int_equal(price_table_load(cJSON_GetObjectItemCaseSensitive(prof, "pricing"), &t, err,
                                      sizeof(err)), 0);
    assert_int_equal(price_unlisted_raw(&t, "{\"model\":\"gpt-image-2\"}", 23), 1);
    assert_int_equal(price_unlisted_raw(&t, "{\"model\":\"gpt-image-1\"}", 23), 0);
    price_table_fini(&t);
    cJSON_Delete(prof);
    /* The shipped OpenAI videos table: a dated model name it does not list is unpriced (it was
     * priced at 0, past every amount budget); the listed pairs and the defaults are priced. */
    static const struct {
        const char *body;
        int unlisted;
    } videos[] = {
        {"{\"model\":\"sora-2-pro-2025-10-06\",\"size\":\"1792x1024\",\"seconds\":\"12\"}", 1},
        {"{\"model\":\"sora-2-pro\",\"size\":\"1792x1024\",\"seconds\":\"12\"}", 0},
        {"{\"prompt\":\"p\"}", 0},
        {"{\"model\":\"sora-2\",\"size\":\"1024x1792\"}", 1},
    };
    prof = read_profile("openai-videos");
    assert_int_equal(price_table_load(cJSON_GetObjectItemCaseSensitive(prof, "pricing"), &t, err,
                                      sizeof(err)), 0);
    for (size_t i = 0; i < N_ROWS(videos); i++)
        if (price_unlisted_raw(&t, videos[i].body, strlen(videos[i].body)) != videos[i].unlisted)
            fail_msg("videos row %zu: unlisted should be %d", i, videos[i].unlisted);
    price_table_fini(&t);
    cJSON_Delete(prof);
}

/* Issue 21 §7: an unpriced request (a model the table does not list) is never a silent 0 under a
 * budget: the store refuses it, unless fallback_per_output prices it — then it is estimated and
 * settled by that price and is not unpriced. */
static void test_unpriced_model_refused_under_budget(void **state)
{
    (void)state;
    static const char *const FB =
        "{\"currency\":\"USD\",\"fallback_per_output\":500000,\"variants\":{\"keys\":"
        "[\"$.model\"],\"tables\":{\"a\":{\"per_output\":5}}}}";
    static const char *const NOFB =
        "{\"currency\":\"USD\",\"variants\":{\"keys\":[\"$.model\"],\"tables\":{\"a\":"
        "{\"per_output\":5}}}}";
    static const struct {
        const char *table, *body;
        int requested, received;
        long long estimate, actual;
        int unpriced;
    } rows[] = {
        {NOFB, "{\"model\":\"b\",\"n\":10}", 10, 10, 0, 0, 1},      /* the silent 0 */
        {FB, "{\"model\":\"b\",\"n\":10}", 10, 10, 5000000, 5000000, 0},
        {FB, "{\"model\":\"b\",\"n\":3}", 3, 1, 1500000, 500000, 0}, /* partial: delivered */
        {FB, "{\"model\":\"b\"}", 0, -1, 500000, 500000, 0},
        {FB, "{\"model\":\"a\",\"n\":2}", 2, 2, 10, 10, 0},          /* listed: its table */
        {FB, "not json", 1, 1, 500000, 500000, 0},
    };
    for (size_t i = 0; i < N_ROWS(rows); i++) {
        cJSON *j = cJSON_Parse(rows[i].table);
        struct price_table t;
        char err[200] = "";
        assert_int_equal(price_table_load(j, &t, err, sizeof(err)), 0);
        size_t len = strlen(rows[i].body);
        int unlisted = -1;
        long long est = price_estimate_raw(&t, rows[i].body, len, rows[i].requested);
        long long act = price_actual_raw(&t, rows[i].body, len, rows[i].requested,
                                         rows[i].received, NULL, &unlisted);
        if (est != rows[i].estimate || act != rows[i].actual ||
            price_unlisted_raw(&t, rows[i].body, len) != rows[i].unpriced ||
            unlisted != rows[i].unpriced)
            fail_msg("row %zu: estimate %lld, actual %lld, unpriced %d", i, est, act, unlisted);
        price_table_fini(&t);
        cJSON_Delete(j);
    }
    /* The member is validated like the others. */
    static const struct {
        const char *table, *err;
    } bad[] = {
        {"{\"currency\":\"USD\",\"fallback_per_output\":5}", "needs \"variants\""},
        {"{\"currency\":\"USD\",\"fallback_per_output\":-1,\"variants\":{\"keys\":"
         "[\"$.model\"],\"tables\":{\"a\":{}}}}", "pricing.fallback_per_output"},
        {"{\"currency\":\"USD\",\"fallback_per_output\":0.5,\"variants\":{\"keys\":"
         "[\"$.model\"],\"tables\":{\"a\":{}}}}", "pricing.fallback_per_output"},
        {"{\"currency\":\"USD\",\"variants\":{\"keys\":[\"$.model\"],\"tables\":{\"a\":"
         "{\"fallback_per_output\":5}}}}", "top-level"},
    };
    for (size_t i = 0; i < N_ROWS(bad); i++) {
        cJSON *j = cJSON_Parse(bad[i].table);
        struct price_table t;
        char err[200] = "";
        if (price_table_load(j, &t, err, sizeof(err)) == 0 || !strstr(err, bad[i].err))
            fail_msg("bad row %zu: err \"%s\"", i, err);
        cJSON_Delete(j);
    }
}

static void test_no_table_costs_nothing(void **state)
{
    (void)state;
    struct price_table t;
    char err[64] = "";
    assert_int_equal(price_table_load(NULL, &t, err, sizeof(err)), 0);
    assert_false(t.present);
    assert_null(t.currency);
    assert_int_equal(price_estimate_raw(&t, "{\"n\":3}", 7, 3), 0);
    assert_int_equal(price_actual_raw(&t, "{\"n\":3}", 7, 3, 3, NULL, NULL), 0);
}

/* A job is priced only in the currency it was recorded in (its estimate stands otherwise): a
 * table's currency changed since its intake would write yen on a dollar row. A job recorded
 * without one (unpriced then) is priced as before. */
static void test_a_job_is_priced_in_its_own_currency(void **state)
{
    (void)state;
    static char usd_name[] = "USD";
    static const struct price_table usd = {.present = 1, .currency = usd_name}, none = {0};
    static const struct {
        const struct price_table *t;
        const char *recorded;
        int want;
    } rows[] = {
        {&usd, "USD", 1}, {&usd, "JPY", 0}, {&usd, "usd", 0}, {&usd, NULL, 1},
        {&usd, "", 1},    {&none, "USD", 0}, {&none, NULL, 1},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (price_currency_fits(rows[i].t, rows[i].recorded) != rows[i].want)
            fail_msg("row %zu", i);
}

struct bad_table {
    const char *json;
    const char *member; /* the message names it */
};

static const struct bad_table bad_tables[] = {
    {"{}", "currency"},
    {"{\"currency\":\"usd\"}", "currency"},
    {"{\"currency\":\"DOLLARS\"}", "currency"},
    {"[]", "currency"},
    {"{\"currency\":\"USD\",\"per_output\":-1}", "per_output"},
    {"{\"currency\":\"USD\",\"per_output\":0.5}", "per_output"},
    {"{\"currency\":\"USD\",\"per_request\":\"10\"}", "per_request"},
    {"{\"currency\":\"USD\",\"per_second\":100}", "per_second"},
    {"{\"currency\":\"USD\",\"seconds\":\"seconds\"}", "seconds"},
    {"{\"currency\":\"USD\",\"per_output_by\":{\"keys\":[],\"prices\":{}}}", "per_output_by"},
    {"{\"currency\":\"USD\",\"per_output_by\":{\"keys\":[\"$.a\"],\"prices\":{\"x\":-5}}}",
     "per_output_by.prices.x"},
    {"{\"currency\":\"USD\",\"per_output_by\":{\"keys\":[\"$.a\"],\"defaults\":[],"
     "\"prices\":{}}}",
     "per_output_by"},
    {"{\"currency\":\"USD\",\"default_seconds\":-1}", "default_seconds"},
    {"{\"currency\":\"USD\",\"per_second_by\":{\"keys\":[\"$.m\"],\"prices\":{\"a\":1}}}",
     "per_second_by"},
    {"{\"currency\":\"USD\",\"seconds\":\"$.s\",\"per_second_by\":{\"keys\":[\"$.m\"],"
     "\"prices\":{\"a\":0.5}}}",
     "per_second_by.prices.a"},
    {"{\"currency\":\"USD\",\"usage_settles\":1}", "usage_settles"},
    {"{\"currency\":\"USD\",\"usage_settles\":true,\"per_output\":5}", "usage_settles"},
    {"{\"currency\":\"USD\",\"per_megapixel\":5,\"width\":\"$.w\"}", "per_megapixel"},
    {"{\"currency\":\"USD\",\"megapixel\":0}", "megapixel"},
    {"{\"currency\":\"USD\",\"variants\":{\"keys\":[\"$.model\"]}}", "variants"},
    {"{\"currency\":\"USD\",\"variants\":{\"keys\":[\"$.model\"],\"tables\":{\"m\":5}}}",
     "variants.tables.m"},
    /* default_when: a variant the tables name, conditions that are paths, one variant key. */
    {"{\"currency\":\"USD\",\"variants\":{\"keys\":[\"$.model\"],\"tables\":{\"m\":{}},"
     "\"default_when\":[{\"variant\":\"x\",\"if\":[\"$.q\"]}]}}",
     "variants.default_when[0]"},
    {"{\"currency\":\"USD\",\"variants\":{\"keys\":[\"$.model\"],\"tables\":{\"m\":{}},"
     "\"default_when\":[{\"variant\":\"m\",\"if\":[\"q=1\"]}]}}",
     "variants.default_when[0].if[0]"},
    {"{\"currency\":\"USD\",\"variants\":{\"keys\":[\"$.model\",\"$.v\"],\"tables\":"
     "{\"m|1\":{}},\"default_when\":[{\"variant\":\"m|1\",\"if\":[\"$.q\"]}]}}",
     "variants.default_when"},
    {"{\"currency\":\"USD\",\"variants\":{\"keys\":[\"$.model\"],\"tables\":{\"m\":"
     "{\"per_output\":-1}}}}",
     "variants.tables.m.per_output"},
    {"{\"currency\":\"USD\",\"variants\":{\"keys\":[\"$.model\"],\"tables\":{\"m\":"
     "{\"variants\":{\"keys\":[\"$.x\"],\"tables\":{\"y\":{}}}}}}}",
     "variants"},
};

static void test_bad_tables_name_the_member(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ROWS(bad_tables); i++) {
        cJSON *j = cJSON_Parse(bad_tables[i].json);
        struct price_table t;
        char err[200] = "";
        assert_non_null(j);
        if (price_table_load(j, &t, err, sizeof(err)) == 0)
            fail_msg("row %zu: %s accepted", i, bad_tables[i].json);
        if (!strstr(err, bad_tables[i].member))
            fail_msg("row %zu: \"%s\" does not name %s", i, err, bad_tables[i].member);
        assert_false(t.present);
        cJSON_Delete(j);
    }
}

struct amount_case {
    const char *in;
    int ok;
    long long micros;
    const char *formatted;
};

static const struct amount_case amounts[] = {
    {"0", 1, 0, "0.000000"},
    {"12", 1, 12000000, "12.000000"},
    {"12.5", 1, 12500000, "12.500000"},
    {"0.000001", 1, 1, "0.000001"},
    {"3.000001", 1, 3000001, "3.000001"},
    {"1000000", 1, 1000000000000, "1000000.000000"},
    {"0.0000001", 0, 0, NULL},
    {"-1", 0, 0, NULL},
    {"1.", 0, 0, NULL},
    {".5", 0, 0, NULL},
    {"1e3", 0, 0, NULL},
    {"1,5", 0, 0, NULL},
    {"", 0, 0, NULL},
    {" 1", 0, 0, NULL},
    {"99999999999999999999", 0, 0, NULL},
};

static void test_amounts(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ROWS(amounts); i++) {
        long long m = -7;
        int rc = price_parse_amount(amounts[i].in, &m);
        if ((rc == 0) != amounts[i].ok)
            fail_msg("row %zu (%s): rc %d", i, amounts[i].in, rc);
        if (!amounts[i].ok)
            continue;
        char buf[32];
        assert_int_equal(m, amounts[i].micros);
        assert_string_equal(price_format(m, buf, sizeof(buf)), amounts[i].formatted);
    }
    char buf[32];
    assert_string_equal(price_format(-1500000, buf, sizeof(buf)), "-1.500000");
    assert_int_equal(price_parse_amount(NULL, &(long long){0}), -1);
}

struct query_case {
    const char *from, *to, *group;
    int ok;
    enum usage_group want;
};

static const struct query_case queries[] = {
    {NULL, NULL, NULL, 1, UG_PROVIDER},
    {"2026-12-01", "2026-12-02", "day", 1, UG_DAY},
    {"2026-12-01T00:00:00Z", NULL, "route", 1, UG_ROUTE},
    {"2026-12-01T10:30:00.123456+01:00", "2026-12-31T23:59:59-05:00", "provider", 1, UG_PROVIDER},
    {"2024-02-29", NULL, NULL, 1, UG_PROVIDER},
    {"2026-02-29", NULL, NULL, 0, 0},
    {"2026-13-01", NULL, NULL, 0, 0},
    {"2026-12-32", NULL, NULL, 0, 0},
    {"2026-12-01T24:00:00Z", NULL, NULL, 0, 0},
    {"2026-12-01T10:00:00", NULL, NULL, 0, 0},
    {"2026-12-01 10:00:00Z", NULL, NULL, 0, 0},
    {"yesterday", NULL, NULL, 0, 0},
    {NULL, "2026-12-01'; DROP TABLE operations; --", NULL, 0, 0},
    {NULL, NULL, "tenant", 0, 0},
    {NULL, NULL, "", 0, 0},
};

static void test_usage_queries(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ROWS(queries); i++) {
        struct usage_query q;
        char err[128] = "";
        int rc = usage_query_parse(queries[i].from, queries[i].to, queries[i].group, &q, err,
                                   sizeof(err));
        if ((rc == 0) != queries[i].ok)
            fail_msg("row %zu: rc %d (%s)", i, rc, err);
        if (rc == 0)
            assert_int_equal(q.group, queries[i].want);
        else
            assert_true(err[0] != '\0');
    }
}

struct sweep_case {
    long long deleted[RET__KINDS];
    int batch, round, max_rounds;
    int more;
};

static const struct sweep_case sweeps[] = {
    {{0, 0, 0}, 100, 1, 20, 0},
    {{99, 99, 99}, 100, 1, 20, 0},
    {{100, 0, 0}, 100, 1, 20, 1},   /* operations filled their batch */
    {{0, 100, 0}, 100, 1, 20, 1},   /* webhook records */
    {{0, 0, 100}, 100, 1, 20, 1},   /* parked hints */
    {{100, 100, 100}, 100, 19, 20, 1},
    {{100, 100, 100}, 100, 20, 20, 0}, /* the sweep's bound: the rest waits */
    {{5, 0, 0}, 0, 1, 20, 0},
};

static void test_sweep_plan(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ROWS(sweeps); i++) {
        const struct sweep_case *c = &sweeps[i];
        if (ret_more(c->deleted, c->batch, c->round, c->max_rounds) != c->more)
            fail_msg("row %zu: want %d", i, c->more);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prices),
        cmocka_unit_test(test_no_table_costs_nothing),
        cmocka_unit_test(test_a_job_is_priced_in_its_own_currency),
        cmocka_unit_test(test_shipped_price_tables),
        cmocka_unit_test(test_multipart_bodies_are_priced_by_their_fields),
        cmocka_unit_test(test_unlisted_requests),
        cmocka_unit_test(test_unpriced_model_refused_under_budget),
        cmocka_unit_test(test_bad_tables_name_the_member),
        cmocka_unit_test(test_amounts),
        cmocka_unit_test(test_usage_queries),
        cmocka_unit_test(test_sweep_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
