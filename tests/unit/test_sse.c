/* Event streams of the LLM APIs (sse.h): the terminal event, the error event and the usage of
 * each format, on whole streams and on streams cut anywhere. Table-driven. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "idemgate/sse.h"

#include <cjson/cJSON.h>

#define CHAT_CHUNK(c)                                                                              \
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"         \
    "\"delta\":{\"content\":\"" c "\"},\"finish_reason\":null}]}\n\n"

static const char chat_whole[] =
    CHAT_CHUNK("Hel") CHAT_CHUNK("lo")
    "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,"
    "\"total_tokens\":11}}\n\n"
    "data: [DONE]\n\n";

static const char anthropic_whole[] =
    "event: message_start\r\n"
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":"
    "25,\"output_tokens\":1}}}\r\n\r\n"
    "event: ping\r\ndata: {\"type\": \"ping\"}\r\n\r\n"
    ": a comment\r\n"
    "event: content_block_delta\r\n"
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\","
    "\"text\":\"Hi\"}}\r\n\r\n"
    "event: message_delta\r\n"
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":"
    "{\"output_tokens\":15}}\r\n\r\n"
    "event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n";

static const char anthropic_error[] =
    "event: message_start\n"
    "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3}}}\n\n"
    "event: error\n"
    "data: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"x\"}}\n\n";

static const char responses_whole[] =
    "event: response.created\n"
    "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\","
    "\"status\":\"in_progress\",\"usage\":null}}\n\n"
    "event: response.output_text.delta\n"
    "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"delta\":\"Hi\"}\n\n"
    "event: response.completed\n"
    "data: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_1\","
    "\"status\":\"completed\",\"usage\":{\"input_tokens\":5,\"output_tokens\":7}}}\n\n";

static const char responses_failed[] =
    "event: response.failed\n"
    "data: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\"}}\n\n";

static void test_whole_streams(void **state)
{
    (void)state;
    static const struct {
        enum sse_format f;
        const char *body;
        int events, terminal, error;
        const char *usage;
    } cases[] = {
        {SSE_OPENAI_CHAT, chat_whole, 4, 1, 0,
         "{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}"},
        {SSE_ANTHROPIC, anthropic_whole, 5, 1, 0, "{\"input_tokens\":25,\"output_tokens\":15}"},
        {SSE_ANTHROPIC, anthropic_error, 2, 0, 1, "{\"input_tokens\":3}"},
        {SSE_OPENAI_RESPONSES, responses_whole, 3, 1, 0,
         "{\"input_tokens\":5,\"output_tokens\":7}"},
        {SSE_OPENAI_RESPONSES, responses_failed, 1, 1, 1, NULL},
        /* A format reads only its own terminal event. */
        {SSE_ANTHROPIC, chat_whole, 4, 0, 0, NULL},
        {SSE_OPENAI_CHAT, anthropic_whole, 5, 0, 0, "{\"output_tokens\":15}"},
        {SSE_OPENAI_CHAT, "data: {\"error\":{\"message\":\"boom\"}}\n\n", 1, 0, 1, NULL},
        {SSE_OPENAI_CHAT, "data: {\"error\":null}\n\ndata: [DONE]\n\n", 2, 1, 0, NULL},
        {SSE_OPENAI_CHAT, "", 0, 0, 0, NULL},
        {SSE_OPENAI_CHAT, "data: [DONE]\r\r", 1, 1, 0, NULL}, /* CR alone ends lines too */
        {SSE_OPENAI_CHAT, "data: [DONE]\n", 0, 0, 0, NULL},   /* never dispatched */
        {SSE_OPENAI_CHAT, "data:[DONE]\n\n", 1, 1, 0, NULL},  /* no space after the colon */
        {SSE_OPENAI_CHAT, "data: [DONE] \n\n", 1, 0, 0, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sse_verdict v;
        print_message("case %zu\n", i);
        assert_int_equal(sse_read(cases[i].f, cases[i].body, strlen(cases[i].body), &v), 0);
        assert_int_equal(v.events, cases[i].events);
        assert_int_equal(v.terminal, cases[i].terminal);
        assert_int_equal(v.error, cases[i].error);
        if (cases[i].usage) {
            assert_non_null(v.usage);
            assert_string_equal(v.usage, cases[i].usage);
        } else {
            assert_null(v.usage);
        }
        sse_verdict_fini(&v);
    }
}

/* Every strict prefix of a whole stream lacks its terminal event: a cut stream is never taken
 * for a complete one, wherever it was cut. */
/* An error event: its type, the status it stands for, and whether output came before it (a
 * chunk with text, a content block, an output item): only an error before any output is the
 * refusal it names. */
static void test_error_events(void **state)
{
    (void)state;
#define ANT_EV(t, d) "event: " t "\ndata: " d "\n\n"
#define ANT_START ANT_EV("message_start", "{\"type\":\"message_start\",\"message\":{}}")
#define ANT_ERR(t) ANT_EV("error", "{\"type\":\"error\",\"error\":{\"type\":\"" t "\"}}")
    static const struct {
        enum sse_format f;
        const char *body;
        int error, output, status;
        const char *type;
    } cases[] = {
        {SSE_ANTHROPIC, anthropic_error, 1, 0, 529, "overloaded_error"},
        {SSE_ANTHROPIC, ANT_START ANT_EV("ping", "{}") ANT_ERR("rate_limit_error"), 1, 0, 429,
         "rate_limit_error"},
        {SSE_ANTHROPIC, ANT_ERR("invalid_request_error"), 1, 0, 400, "invalid_request_error"},
        {SSE_ANTHROPIC, ANT_ERR("api_error"), 1, 0, 500, "api_error"},
        {SSE_ANTHROPIC, ANT_ERR("a_new_error"), 1, 0, 0, "a_new_error"},
        /* a content block began: output, whatever error follows */
        {SSE_ANTHROPIC,
         ANT_START ANT_EV("content_block_start", "{\"index\":0}") ANT_ERR("overloaded_error"), 1,
         1, 529, "overloaded_error"},
        {SSE_ANTHROPIC, anthropic_whole, 0, 1, 0, ""},
        /* OpenAI chat: the first chunk's role and empty content are not output */
        {SSE_OPENAI_CHAT,
         "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
         "data: {\"error\":{\"type\":\"server_error\",\"code\":null}}\n\n",
         1, 0, 500, "server_error"},
        {SSE_OPENAI_CHAT,
         "data: {\"error\":{\"type\":\"requests\",\"code\":\"rate_limit_exceeded\"}}\n\n", 1,
         0, 429, "rate_limit_exceeded"},
        {SSE_OPENAI_CHAT, CHAT_CHUNK("Hel") "data: {\"error\":{\"type\":\"server_error\"}}\n\n",
         1, 1, 500, "server_error"},
        {SSE_OPENAI_CHAT, "data: {\"error\":{\"message\":\"boom\"}}\n\n", 1, 0, 0, ""},
        {SSE_OPENAI_CHAT,
         "data: {\"choices\":[{\"delta\":{\"tool_calls\":[]}}]}\n\ndata: {\"error\":{}}\n\n", 1, 1,
         0, ""},
        /* reasoning (compatible providers) and audio (audio models) are generated, and billed:
         * output, whatever error follows — never read as a refusal that made nothing */
        {SSE_OPENAI_CHAT,
         "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"
         "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n"
         "data: {\"error\":{\"type\":\"rate_limit_error\",\"code\":\"rate_limit_exceeded\"}}\n\n",
         1, 1, 429, "rate_limit_exceeded"},
        {SSE_OPENAI_CHAT,
         "data: {\"choices\":[{\"delta\":{\"reasoning\":\"hm\"}}]}\n\n"
         "data: {\"error\":{\"type\":\"invalid_request_error\"}}\n\n",
         1, 1, 400, "invalid_request_error"},
        {SSE_OPENAI_CHAT,
         "data: {\"choices\":[{\"delta\":{\"audio\":{\"id\":\"a\",\"data\":\"UklG\"}}}]}\n\n"
         "data: {\"error\":{\"code\":\"rate_limit_exceeded\"}}\n\n",
         1, 1, 429, "rate_limit_exceeded"},
        /* a role, a null content and an empty refusal are still nothing generated */
        {SSE_OPENAI_CHAT,
         "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":null,"
         "\"refusal\":\"\"}}]}\n\n"
         "data: {\"error\":{\"code\":\"rate_limit_exceeded\"}}\n\n",
         1, 0, 429, "rate_limit_exceeded"},
        /* Responses: created / in progress are not output; a failed response's error code */
        {SSE_OPENAI_RESPONSES,
         "event: response.created\ndata: {\"response\":{\"id\":\"r\"}}\n\n"
         "event: response.failed\ndata: {\"response\":{\"error\":{\"code\":\"server_error\"}}}\n\n",
         1, 0, 500, "server_error"},
        {SSE_OPENAI_RESPONSES,
         "event: response.in_progress\ndata: {}\n\n"
         "event: error\ndata: {\"type\":\"error\",\"code\":\"rate_limit_exceeded\"}\n\n",
         1, 0, 429, "rate_limit_exceeded"},
        {SSE_OPENAI_RESPONSES,
         "event: response.output_text.delta\ndata: {\"delta\":\"x\"}\n\n"
         "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\"}\n\n",
         1, 1, 500, "server_error"},
        {SSE_OPENAI_RESPONSES, responses_whole, 0, 1, 0, ""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sse_verdict v;
        print_message("case %zu\n", i);
        assert_int_equal(sse_read(cases[i].f, cases[i].body, strlen(cases[i].body), &v), 0);
        assert_int_equal(v.error, cases[i].error);
        assert_int_equal(v.output, cases[i].output);
        assert_int_equal(v.error_status, cases[i].status);
        assert_string_equal(v.error_type, cases[i].type);
        sse_verdict_fini(&v);
    }
    /* The generation's id: the first event naming one, per format. */
    static const struct {
        enum sse_format f;
        const char *body, *id;
    } ids[] = {
        {SSE_OPENAI_RESPONSES, responses_whole, "resp_1"},
        {SSE_ANTHROPIC, anthropic_whole, "msg_1"},
        {SSE_OPENAI_CHAT, chat_whole, "c1"},
        {SSE_ANTHROPIC, anthropic_error, ""}, /* its message_start names none */
    };
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        struct sse_verdict v;
        assert_int_equal(sse_read(ids[i].f, ids[i].body, strlen(ids[i].body), &v), 0);
        assert_string_equal(v.id, ids[i].id);
        sse_verdict_fini(&v);
    }
    assert_int_equal(sse_error_status(NULL), 0);
    assert_int_equal(sse_error_status("overloaded_error"), 529);
}

/* The reading skips parsing the deltas that can only say "output" (most of a stream), never an
 * event that carries what it reads: usage and errors after the output began, a member spelled
 * with escapes, an event whose type only its data names. */
static void test_skipped_deltas_hide_nothing(void **state)
{
    (void)state;
#define CHAT_ID "data: {\"id\":\"c9\",\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"
#define RESP_ID "event: response.created\ndata: {\"response\":{\"id\":\"r9\"}}\n\n"
#define RESP_DELTA "event: response.output_text.delta\ndata: {\"delta\":\"x\"}\n\n"
    static const struct {
        enum sse_format f;
        const char *body;
        int error, status, terminal;
        const char *usage;
    } cases[] = {
        {SSE_OPENAI_CHAT,
         CHAT_ID CHAT_CHUNK("a") CHAT_CHUNK("b")
         "data: {\"choices\":[],\"\\u0075sage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n",
         0, 0, 1, "{\"prompt_tokens\":1}"},
        {SSE_OPENAI_CHAT,
         CHAT_ID CHAT_CHUNK("a") "data: {\"\\u0065rror\":{\"type\":\"server_error\"}}\n\n", 1,
         500, 0, NULL},
        {SSE_OPENAI_CHAT, CHAT_ID CHAT_CHUNK("a") CHAT_CHUNK("b") "data: [DONE]\n\n", 0, 0, 1, NULL},
        /* include_usage: "usage": null on every chunk, the last one's the object */
        {SSE_OPENAI_CHAT,
         CHAT_ID "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n"
                 "data: {\"choices\":[],\"usage\" : null, "
                 "\"x\":{\"usage\": {\"prompt_tokens\":7}}}\n\n"
                 "data: {\"x\":{\"usage\":null},\"usage\":{\"prompt_tokens\":5}}\n\n"
                 "data: [DONE]\n\n",
         0, 0, 1, "{\"prompt_tokens\":5}"},
        {SSE_OPENAI_CHAT,
         CHAT_ID "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n"
                 "data: {\"choices\":[],\"usage\":\t{\"prompt_tokens\":2}}\n\n"
                 "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"usage\":null}\n\n"
                 "data: [DONE]\n\n",
         0, 0, 1, "{\"prompt_tokens\":2}"},
        {SSE_ANTHROPIC,
         "event: message_start\ndata: {\"message\":{\"id\":\"m9\",\"usage\":{\"input_tokens\":"
         "4}}}\n\n"
         "event: content_block_delta\ndata: {\"delta\":{\"text\":\"a\"}}\n\n"
         "event: content_block_delta\ndata: {\"delta\":{\"text\":\"b\"}}\n\n"
         "event: message_delta\ndata: {\"usage\":{\"output_tokens\":2}}\n\n"
         "event: message_stop\ndata: {}\n\n",
         0, 0, 1, "{\"input_tokens\":4,\"output_tokens\":2}"},
        {SSE_OPENAI_RESPONSES,
         RESP_ID RESP_DELTA RESP_DELTA
         "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\"}\n\n",
         1, 500, 0, NULL},
        {SSE_OPENAI_RESPONSES,
         RESP_ID RESP_DELTA "data: {\"type\":\"error\",\"code\":\"rate_limit_exceeded\"}\n\n", 1,
         429, 0, NULL},
        {SSE_OPENAI_RESPONSES,
         RESP_ID RESP_DELTA
         "event: response.completed\ndata: {\"response\":{\"id\":\"r9\",\"usage\":{\"input_"
         "tokens\":3}}}\n\n",
         0, 0, 1, "{\"input_tokens\":3}"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sse_verdict v;
        print_message("case %zu\n", i);
        assert_int_equal(sse_read(cases[i].f, cases[i].body, strlen(cases[i].body), &v), 0);
        assert_int_equal(v.output, 1);
        assert_int_equal(v.error, cases[i].error);
        assert_int_equal(v.error_status, cases[i].status);
        assert_int_equal(v.terminal, cases[i].terminal);
        if (cases[i].usage)
            assert_string_equal(v.usage, cases[i].usage);
        else
            assert_null(v.usage);
        sse_verdict_fini(&v);
    }
}

static void test_every_cut_is_incomplete(void **state)
{
    (void)state;
    static const struct {
        enum sse_format f;
        const char *body;
    } whole[] = {{SSE_OPENAI_CHAT, chat_whole},
                 {SSE_ANTHROPIC, anthropic_whole},
                 {SSE_OPENAI_RESPONSES, responses_whole}};
    for (size_t k = 0; k < sizeof(whole) / sizeof(whole[0]); k++) {
        size_t n = strlen(whole[k].body);
        /* The last event's closing blank line (2 or 4 bytes) is what dispatches it. */
        size_t blank = whole[k].body[n - 2] == '\r' ? 4 : 2;
        for (size_t cut = 0; cut + blank <= n - 1; cut++) {
            struct sse_verdict v;
            assert_int_equal(sse_read(whole[k].f, whole[k].body, cut, &v), 0);
            if (v.terminal)
                print_message("format %zu cut at %zu of %zu\n", k, cut, n);
            assert_int_equal(v.terminal, 0);
            sse_verdict_fini(&v);
        }
    }
}

static void test_requested_and_names(void **state)
{
    (void)state;
    static const struct {
        const char *body;
        int yes;
    } cases[] = {
        {"{\"model\":\"m\",\"stream\":true}", 1},
        {"{\"stream\":false}", 0},
        {"{\"stream\":\"true\"}", 0},
        {"{\"options\":{\"stream\":true}}", 0},
        {"[true]", 0},
        {"", 0},
        {"{\"stream\":true", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(sse_requested(cases[i].body, strlen(cases[i].body)), cases[i].yes);
    for (int f = SSE_OPENAI_CHAT; f <= SSE_OPENAI_RESPONSES; f++)
        assert_int_equal(sse_format_parse(sse_format_name((enum sse_format)f)), f);
    assert_int_equal(sse_format_parse("openai"), -1);
    assert_int_equal(sse_format_parse(NULL), -1);
}

/* The answer assembled from events[0..m) is want (members may come in another order). */
static void assert_assembles_to(enum sse_format f, const char *events, size_t m,
                                const char *want)
{
    size_t k = 0;
    char *again = sse_assemble(f, events, m, &k);
    assert_non_null(again);
    cJSON *a = cJSON_Parse(again), *b = cJSON_Parse(want);
    if (!cJSON_Compare(a, b, 1))
        fail_msg("%s != %s", again, want);
    cJSON_Delete(a);
    cJSON_Delete(b);
    free(again);
}

/* A whole answer from a whole stream; a stream from a whole answer; and the two agree: the
 * answer assembled from a synthesized stream is the answer it was made from. */
static void test_assemble_and_synthesize(void **state)
{
    (void)state;
    static const struct {
        enum sse_format f;
        const char *body, *whole;
    } cases[] = {
        {SSE_OPENAI_CHAT, chat_whole,
         "{\"id\":\"c1\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":"
         "{\"role\":\"assistant\",\"content\":\"Hello\"},\"finish_reason\":null}],\"usage\":"
         "{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}"},
        {SSE_ANTHROPIC, anthropic_whole,
         "{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":25,\"output_tokens\":15},\"content\":"
         "[],\"stop_reason\":\"end_turn\"}"},
        {SSE_OPENAI_RESPONSES, responses_whole,
         "{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":5,"
         "\"output_tokens\":7}}"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t n = 0, m = 0;
        print_message("case %zu\n", i);
        char *whole = sse_assemble(cases[i].f, cases[i].body, strlen(cases[i].body), &n);
        assert_non_null(whole);
        assert_string_equal(whole, cases[i].whole);
        assert_int_equal(n, strlen(whole));
        char *events = sse_synthesize(cases[i].f, whole, n, &m);
        assert_non_null(events);
        struct sse_verdict v;
        assert_int_equal(sse_read(cases[i].f, events, m, &v), 0);
        assert_int_equal(v.terminal, 1);
        assert_int_equal(v.error, 0);
        sse_verdict_fini(&v);
        assert_assembles_to(cases[i].f, events, m, whole);
        free(whole);
        free(events);
    }
    /* Anthropic's text blocks are assembled from their deltas. */
    static const char blocks[] =
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\","
        "\"content\":[],\"usage\":{\"input_tokens\":1}}}\n\n"
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,"
        "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
        "\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n"
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
        "\"delta\":{\"type\":\"text_delta\",\"text\":\"lo\"}}\n\n"
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"
        "\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n"
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    size_t n = 0;
    char *whole = sse_assemble(SSE_ANTHROPIC, blocks, sizeof(blocks) - 1, &n);
    assert_non_null(whole);
    assert_string_equal(whole, "{\"id\":\"m\",\"usage\":{\"input_tokens\":1,\"output_tokens\":2},"
                               "\"content\":[{\"type\":\"text\",\"text\":\"Hello\"}],"
                               "\"stop_reason\":\"end_turn\"}");
    free(whole);
    /* A message_delta whose delta names the message's own content (and id) changes neither: the
     * blocks assembled from the deltas are the answer's. Copied over them, the content array
     * the pending texts point into was freed (a use after free, found by a review). */
    static const char hostile[] =
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\","
        "\"content\":[]}}\n\n"
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,"
        "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
        "\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n"
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"content\":"
        "[{\"type\":\"text\",\"text\":\"forged\"}],\"stop_reason\":\"end_turn\"}}\n\n"
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    whole = sse_assemble(SSE_ANTHROPIC, hostile, sizeof(hostile) - 1, &n);
    assert_non_null(whole);
    assert_string_equal(whole, "{\"id\":\"m\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"}],"
                               "\"stop_reason\":\"end_turn\"}");
    free(whole);
    /* Many small deltas (a long answer): every one of them, in order. */
    size_t cap = 64 + 20000 * 120, o = 0;
    char *many = malloc(cap);
    assert_non_null(many);
    for (int i = 0; i < 20000; i++)
        o += (size_t)snprintf(many + o, cap - o,
                              "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":"
                              "{\"content\":\"%c\"}}]}\n\n",
                              'a' + i % 26);
    o += (size_t)snprintf(many + o, cap - o, "data: [DONE]\n\n");
    char *big = sse_assemble(SSE_OPENAI_CHAT, many, o, &n);
    assert_non_null(big);
    cJSON *doc = cJSON_Parse(big);
    const char *text = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(
            cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "choices"), 0), "message"),
        "content"));
    assert_non_null(text);
    assert_int_equal(strlen(text), 20000);
    assert_int_equal(text[0], 'a');
    assert_int_equal(text[19999], 'a' + 19999 % 26);
    cJSON_Delete(doc);
    free(big);
    free(many);
    /* Nothing whole is made of a stream that is not. */
    assert_null(sse_assemble(SSE_ANTHROPIC, anthropic_error, strlen(anthropic_error), &n));
    assert_null(sse_assemble(SSE_OPENAI_CHAT, chat_whole, strlen(chat_whole) - 3, &n));
    assert_null(sse_synthesize(SSE_OPENAI_CHAT, "{\"content\":[]}", 14, &n));
    assert_null(sse_synthesize(SSE_ANTHROPIC, "[1]", 3, &n));
}

/* Assembled, then synthesized, then assembled again: the same answer (members in any order). */
static void round_trip(enum sse_format f, const char *stream, const char *want)
{
    size_t n = 0, m = 0, k = 0;
    char *whole = sse_assemble(f, stream, strlen(stream), &n);
    assert_non_null(whole);
    cJSON *got = cJSON_Parse(whole), *exp = cJSON_Parse(want);
    assert_non_null(exp);
    if (!cJSON_Compare(got, exp, 1))
        fail_msg("%s != %s", whole, want);
    char *events = sse_synthesize(f, whole, n, &m);
    assert_non_null(events);
    struct sse_verdict v;
    assert_int_equal(sse_read(f, events, m, &v), 0);
    assert_int_equal(v.terminal, 1);
    sse_verdict_fini(&v);
    char *again = sse_assemble(f, events, m, &k);
    assert_non_null(again);
    cJSON *back = cJSON_Parse(again);
    if (!cJSON_Compare(back, exp, 1))
        fail_msg("%s != %s (from %s)", again, want, events);
    cJSON_Delete(got);
    cJSON_Delete(exp);
    cJSON_Delete(back);
    free(whole);
    free(events);
    free(again);
}

/* A recorded stream served to a client that asked for JSON (and the other way) keeps its tool
 * calls: Chat's arrive in pieces by index, Anthropic's input as JSON text in pieces, a thinking
 * block's signature in its own delta. They were dropped: `finish_reason: tool_calls` with no
 * call, a tool_use with `input: {}`. A delta this assembler does not know makes no answer at
 * all (the stream is served as recorded), never one missing a part. */
/* A Responses stream synthesized from a whole answer carries the events a client following it
 * needs, as OpenAI streams them: response.created first (openai-python's stream helper refuses
 * a stream without it), the output items, a message's text as a delta, then the terminal event;
 * sequence numbers 0, 1, 2 … Before, the terminal event alone. */
static void test_responses_synthesized_as_streamed(void **state)
{
    (void)state;
    static const char whole[] =
        "{\"id\":\"resp_9\",\"object\":\"response\",\"status\":\"completed\",\"output\":["
        "{\"id\":\"msg_1\",\"type\":\"message\",\"status\":\"completed\",\"role\":\"assistant\","
        "\"content\":[{\"type\":\"output_text\",\"text\":\"Hello there\",\"annotations\":[]}]},"
        "{\"id\":\"fc_1\",\"type\":\"function_call\",\"status\":\"completed\",\"name\":\"f\","
        "\"arguments\":\"{}\",\"call_id\":\"c\"}],"
        "\"usage\":{\"input_tokens\":3,\"output_tokens\":4}}";
    static const char *const want[] = {
        "response.created",           "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.output_item.done",
        "response.completed"};
    size_t m = 0;
    char *events = sse_synthesize(SSE_OPENAI_RESPONSES, whole, sizeof(whole) - 1, &m);
    assert_non_null(events);
    size_t k = 0;
    for (char *line = events; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1
                                                                       : NULL) {
        if (strncmp(line, "data: ", 6) != 0)
            continue;
        char *end = strchr(line, '\n');
        cJSON *d = cJSON_ParseWithLength(line + 6, (size_t)(end - line - 6));
        assert_non_null(d);
        assert_true(k < sizeof(want) / sizeof(want[0]));
        assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(d, "type")), want[k]);
        assert_int_equal((int)cJSON_GetNumberValue(cJSON_GetObjectItem(d, "sequence_number")),
                         (int)k);
        if (k == 0) { /* in progress, nothing out yet */
            cJSON *r = cJSON_GetObjectItem(d, "response");
            assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(r, "status")),
                                "in_progress");
            assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(r, "output")), 0);
        }
        if (k == 4)
            assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(d, "delta")),
                                "Hello there");
        cJSON_Delete(d);
        k++;
    }
    assert_int_equal(k, sizeof(want) / sizeof(want[0]));
    struct sse_verdict v;
    assert_int_equal(sse_read(SSE_OPENAI_RESPONSES, events, m, &v), 0);
    assert_int_equal(v.terminal, 1);
    assert_int_equal(v.error, 0);
    assert_int_equal(v.output, 1);
    assert_string_equal(v.id, "resp_9");
    sse_verdict_fini(&v);
    assert_assembles_to(SSE_OPENAI_RESPONSES, events, m, whole);
    free(events);
}

static void test_tool_calls_are_assembled_and_synthesized(void **state)
{
    (void)state;
    round_trip(SSE_OPENAI_CHAT,
               "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
               "\"content\":null,\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":"
               "\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"\"}}]}}]}\n\n"
               "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":"
               "0,\"function\":{\"arguments\":\"{\\\"city\\\":\"}}]}}]}\n\n"
               "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":"
               "0,\"function\":{\"arguments\":\"\\\"Oslo\\\"}\"}},{\"index\":1,\"id\":\"call_2\","
               "\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]}}]}\n\n"
               "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":"
               "\"tool_calls\"}]}\n\ndata: [DONE]\n\n",
               "{\"id\":\"c\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":"
               "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
               "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"}},"
               "{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"now\","
               "\"arguments\":\"{}\"}}]},\"finish_reason\":\"tool_calls\"}]}");
    round_trip(SSE_ANTHROPIC,
               "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\","
               "\"content\":[]}}\n\n"
               "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,"
               "\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n"
               "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
               "\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hmm\"}}\n\n"
               "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
               "\"delta\":{\"type\":\"signature_delta\",\"signature\":\"sig1\"}}\n\n"
               "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
               "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,"
               "\"content_block\":{\"type\":\"tool_use\",\"id\":\"tu_1\",\"name\":\"get_weather\","
               "\"input\":{}}}\n\n"
               "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,"
               "\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\n"
               "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,"
               "\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\": \"}}\n\n"
               "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,"
               "\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\\\"Oslo\\\"}\"}}\n\n"
               "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n"
               "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,"
               "\"content_block\":{\"type\":\"tool_use\",\"id\":\"tu_2\",\"name\":\"now\","
               "\"input\":{}}}\n\n"
               "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":2}\n\n"
               "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"
               "\"tool_use\"}}\n\n"
               "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
               "{\"id\":\"m\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hmm\",\"signature\":"
               "\"sig1\"},{\"type\":\"tool_use\",\"id\":\"tu_1\",\"name\":\"get_weather\",\"input\":"
               "{\"city\":\"Oslo\"}},{\"type\":\"tool_use\",\"id\":\"tu_2\",\"name\":\"now\","
               "\"input\":{}}],\"stop_reason\":\"tool_use\"}");
    /* A Responses answer the provider cut (max_output_tokens) is whole, and says so again. */
    round_trip(SSE_OPENAI_RESPONSES,
               "event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"response\":"
               "{\"id\":\"r\",\"status\":\"incomplete\"}}\n\n",
               "{\"id\":\"r\",\"status\":\"incomplete\"}");
    size_t n = 0, m = 0;
    static const char cut[] = "{\"id\":\"r\",\"status\":\"incomplete\"}";
    char *events = sse_synthesize(SSE_OPENAI_RESPONSES, cut, sizeof(cut) - 1, &m);
    assert_non_null(events);
    assert_non_null(strstr(events, "event: response.incomplete\n"));
    free(events);
    /* Deltas not assembled here: no answer rather than one that lacks them. */
    static const char *const unknown[] = {
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"audio\":{\"id\":\"a\"}}}]}\n\n"
        "data: [DONE]\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"logprobs\":"
        "{\"content\":[]}}]}\n\ndata: [DONE]\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"function_call\":{\"name\":\"f\"}}}]}\n\n"
        "data: [DONE]\n\n",
    };
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++)
        if (sse_assemble(SSE_OPENAI_CHAT, unknown[i], strlen(unknown[i]), &n))
            fail_msg("assembled %zu", i);
    static const char citations[] =
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\","
        "\"content\":[]}}\n\n"
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,"
        "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
        "\"delta\":{\"type\":\"citations_delta\",\"citation\":{\"cited_text\":\"x\"}}}\n\n"
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    assert_null(sse_assemble(SSE_ANTHROPIC, citations, sizeof(citations) - 1, &n));
}

/* A Chat stream of n choices (OpenAI allows up to 128) is assembled with all of them; a choice
 * whose index is beyond that is not assembled, and then neither is the answer (it is served as
 * recorded): never an answer with choices left out. */
static void test_every_choice_is_assembled_or_none(void **state)
{
    (void)state;
    static const int counts[] = {20, 128, 129};
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        int n = counts[c];
        size_t cap = 256 * (size_t)n + 64, len = 0, k = 0;
        char *body = malloc(cap);
        assert_non_null(body);
        for (int i = 0; i < n; i++)
            len += (size_t)snprintf(body + len, cap - len,
                                    "data: {\"id\":\"c1\",\"choices\":[{\"index\":%d,"
                                    "\"delta\":{\"role\":\"assistant\",\"content\":\"t%d\"}}]}"
                                    "\n\n",
                                    i, i);
        len += (size_t)snprintf(body + len, cap - len, "data: [DONE]\n\n");
        char *whole = sse_assemble(SSE_OPENAI_CHAT, body, len, &k);
        if (n > 128) {
            assert_null(whole);
        } else {
            assert_non_null(whole);
            cJSON *doc = cJSON_Parse(whole);
            const cJSON *choices = cJSON_GetObjectItemCaseSensitive(doc, "choices");
            assert_int_equal(cJSON_GetArraySize(choices), n);
            const cJSON *last = cJSON_GetArrayItem(choices, n - 1);
            const cJSON *msg = cJSON_GetObjectItemCaseSensitive(last, "message");
            char want[16];
            snprintf(want, sizeof(want), "t%d", n - 1);
            assert_string_equal(
                cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(msg, "content")), want);
            cJSON_Delete(doc);
        }
        free(whole);
        free(body);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_streams),
        cmocka_unit_test(test_error_events),
        cmocka_unit_test(test_skipped_deltas_hide_nothing),
        cmocka_unit_test(test_every_cut_is_incomplete),
        cmocka_unit_test(test_requested_and_names),
        cmocka_unit_test(test_assemble_and_synthesize),
        cmocka_unit_test(test_tool_calls_are_assembled_and_synthesized),
        cmocka_unit_test(test_responses_synthesized_as_streamed),
        cmocka_unit_test(test_every_choice_is_assembled_or_none),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
