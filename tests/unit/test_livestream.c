/* The live copy of a stream (livestream.h): what its readers may read, and the terminal event
 * held back until the attempt's result is recorded — a client is never given a whole answer
 * that is not the job's record. No parking here (that needs the HTTP server): reads only. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "idemgate/livestream.h"
#include "idemgate/sse.h"

/* Reads everything visible from pos; returns what the last read said. */
static enum ls_at read_all(struct ls *s, size_t *pos, char *out, size_t cap)
{
    for (;;) {
        size_t n = 0;
        enum ls_at at = ls_read(s, *pos, out + *pos, cap - *pos, &n);
        if (at != LS_BYTES)
            return at;
        *pos += n;
    }
}

static const struct {
    const char *name, *first, *terminal;
} formats[] = {
    {"openai-chat", "data: {\"choices\":[{\"delta\":{\"content\":\"data: [DONE]\"}}]}\n\n",
     "data: [DONE]\n\n"},
    {"anthropic", "event: content_block_delta\r\ndata: {\"x\":1}\r\n\r\n",
     "event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n"},
    {"openai-responses", "event: response.output_text.delta\ndata: {\"delta\":\"x\"}\n\n",
     "event: response.completed\ndata: {\"response\":{}}\n\n"},
};

static void test_the_terminal_event_waits_for_the_record(void **state)
{
    (void)state;
    for (size_t f = 0; f < sizeof(formats) / sizeof(formats[0]); f++)
        for (int recorded = 0; recorded <= 1; recorded++) {
            char id[32], out[512];
            snprintf(id, sizeof(id), "job_t%zu_%d", f, recorded);
            struct ls *s = ls_open(id, 4096, SSE_NONE);
            assert_non_null(s);
            size_t pos = 0, first = strlen(formats[f].first);
            /* fed in two pieces, the terminal event split across them */
            char whole[512];
            snprintf(whole, sizeof(whole), "%s%s", formats[f].first, formats[f].terminal);
            size_t cut = first + 5;
            ls_feed(s, whole, cut);
            assert_int_equal(read_all(s, &pos, out, sizeof(out)), LS_WAIT);
            assert_int_equal(pos, first);
            ls_feed(s, whole + cut, strlen(whole) - cut);
            ls_attempt_end(s, 0);
            /* the text inside the first event's delta is no terminal event; the real one is
             * held until the record's fate is known */
            assert_int_equal(read_all(s, &pos, out, sizeof(out)), LS_WAIT);
            assert_int_equal(pos, first);
            ls_settle(s, recorded);
            enum ls_at at = read_all(s, &pos, out, sizeof(out));
            if (recorded) {
                assert_int_equal(at, LS_END);
                assert_int_equal(pos, strlen(whole));
                assert_memory_equal(out, whole, pos);
            } else {
                assert_int_equal(at, LS_CUT); /* never the whole answer: it is not the record */
                assert_int_equal(pos, first);
            }
            ls_close_own(s);
            ls_release(s);
        }
}

/* The terminal event in every form sse.c reads as one (WHATWG fields): no space after the
 * colon, the type only inside the data, lines ended by CR alone, a JSON document over several
 * data lines. Each is held until the record: a failed record ends the readers cut before it. */
static void test_every_form_of_the_terminal_event_is_held(void **state)
{
    (void)state;
    static const struct {
        const char *first, *terminal;
    } forms[] = {
        {"event:content_block_delta\ndata:{\"x\":1}\n\n", "event:message_stop\ndata:{}\n\n"},
        {"data: {\"type\":\"response.output_text.delta\"}\n\n",
         "data: {\"type\":\"response.completed\",\"response\":{}}\n\n"},
        {"event: content_block_delta\rdata: {}\r\r", "event: message_stop\rdata: {}\r\r"},
        {"data: {\"type\":\"response.output_text.delta\"}\n\n",
         "data: {\"response\": {},\ndata: \"type\": \"response.incomplete\"}\n\n"},
        {"data:{\"choices\":[]}\r\n\r\n", "data:[DONE]\r\n\r\n"},
        /* [DONE] under an event line: sse.c ends a Chat stream there all the same */
        {"data: {\"choices\":[]}\n\n", "event: done\ndata: [DONE]\n\n"},
    };
    for (size_t f = 0; f < sizeof(forms) / sizeof(forms[0]); f++) {
        char id[32], out[512], whole[512];
        snprintf(id, sizeof(id), "job_form%zu", f);
        snprintf(whole, sizeof(whole), "%s%s", forms[f].first, forms[f].terminal);
        struct ls *s = ls_open(id, 4096, SSE_NONE);
        assert_non_null(s);
        size_t pos = 0, first = strlen(forms[f].first);
        for (size_t i = 0; i < strlen(whole); i++) /* a byte at a time: every split */
            ls_feed(s, whole + i, 1);
        if (read_all(s, &pos, out, sizeof(out)) != LS_WAIT || pos != first)
            fail_msg("form %zu: %zu bytes visible before the end, want %zu", f, pos, first);
        ls_attempt_end(s, 0);
        assert_int_equal(read_all(s, &pos, out, sizeof(out)), LS_WAIT);
        ls_settle(s, 0);
        if (read_all(s, &pos, out, sizeof(out)) != LS_CUT || pos != first)
            fail_msg("form %zu: not cut before its terminal event (%zu)", f, pos);
        ls_close_own(s);
        ls_release(s);
    }
}

/* A stream its reader judged whole whose end the live copy did not recognise (here: a type no
 * format names) still ends only with its record: never a clean end the record did not get. */
static void test_an_end_not_recognised_here_still_waits_for_the_record(void **state)
{
    (void)state;
    const char *body = "event: custom.delta\ndata: {}\n\nevent: custom.done\ndata: {}\n\n";
    for (int recorded = 0; recorded <= 1; recorded++) {
        char id[32], out[256];
        snprintf(id, sizeof(id), "job_unrec%d", recorded);
        struct ls *s = ls_open(id, 4096, SSE_NONE);
        size_t pos = 0;
        ls_feed(s, body, strlen(body));
        assert_int_equal(read_all(s, &pos, out, sizeof(out)), LS_WAIT);
        assert_int_equal(pos, strlen(body)); /* every whole event was relayed live */
        ls_attempt_end(s, 0);
        assert_int_equal(read_all(s, &pos, out, sizeof(out)), LS_WAIT); /* no clean end yet */
        ls_settle(s, recorded);
        assert_int_equal(read_all(s, &pos, out, sizeof(out)), recorded ? LS_END : LS_CUT);
        ls_close_own(s);
        ls_release(s);
    }
}

/* A cut stream (no terminal event) ends cut as soon as the transfer ends; a stream closed
 * before its record was settled ends cut at the held event. */
static void test_cut_and_closed_streams(void **state)
{
    (void)state;
    char out[256];
    size_t pos = 0;
    struct ls *s = ls_open("job_cut", 4096, SSE_NONE);
    ls_feed(s, formats[0].first, strlen(formats[0].first));
    ls_attempt_end(s, 1);
    assert_int_equal(read_all(s, &pos, out, sizeof(out)), LS_CUT);
    assert_int_equal(pos, strlen(formats[0].first));
    ls_close_own(s);
    ls_release(s);

    pos = 0;
    s = ls_open("job_closed", 4096, SSE_NONE);
    ls_feed(s, formats[0].terminal, strlen(formats[0].terminal));
    ls_attempt_end(s, 0);
    assert_int_equal(read_all(s, &pos, out, sizeof(out)), LS_WAIT);
    ls_close_own(s); /* abandoned: never recorded */
    assert_int_equal(read_all(s, &pos, out, sizeof(out)), LS_CUT);
    assert_int_equal(pos, 0);
    ls_release(s);
}

/* The intake's "nobody here sends it" (ls_close_unfed) never closes a stream an attempt already
 * feeds: this replica's dispatcher may claim a row recorded for any replica before the intake
 * answers, and the stream is then that attempt's record. Closed under it, every byte fed was
 * dropped and the paid answer was lost. Before any attempt attached, it closes as ls_close. */
static void test_a_stream_an_attempt_feeds_is_never_closed_by_the_intake(void **state)
{
    (void)state;
    char out[512], whole[512];
    size_t pos = 0;
    snprintf(whole, sizeof(whole), "%s%s", formats[0].first, formats[0].terminal);

    struct ls *s = ls_open("job_unfed", 4096, SSE_NONE);
    ls_close_unfed("job_unfed");
    assert_null(ls_attach("job_unfed")); /* the attempt keeps the answer itself */
    ls_release(s);

    s = ls_open("job_fed", 4096, SSE_NONE);
    struct ls *a = ls_attach("job_fed");
    assert_ptr_equal(a, s);
    ls_close_unfed("job_fed");
    ls_release(s); /* the intake's reference */
    struct ls *again = ls_find("job_fed");
    assert_ptr_equal(again, a); /* still registered: joiners follow it */
    ls_release(again);
    ls_feed(a, whole, strlen(whole));
    ls_attempt_end(a, 0);
    char *rec = NULL;
    size_t len = 0;
    int complete = 0;
    assert_int_equal(ls_record(a, &rec, &len, &complete), 0);
    assert_true(complete);
    assert_int_equal(len, strlen(whole)); /* every byte kept: the record */
    assert_memory_equal(rec, whole, len);
    free(rec);
    ls_settle(a, 1);
    assert_int_equal(read_all(a, &pos, out, sizeof(out)), LS_END);
    ls_close_own(a); /* the attempt's end */
    ls_release(a);
}

/* A stream is ended only by the attempt that feeds it, or, unfed, by whatever did not attach:
 * a born reservation refused after its lease ran out (another claim of the job on this replica
 * attached and streams meanwhile), or an attempt freed without a stream of its own, closed the
 * job's stream by its id — every later byte dropped, the whole answer recorded as cut, the job in
 * doubt. And an attempt's own stream, closed, is never confused with one opened for the job
 * since. */
static void test_only_the_feeding_attempt_ends_its_stream(void **state)
{
    (void)state;
    char whole[512], out[512];
    size_t pos = 0;
    snprintf(whole, sizeof(whole), "%s%s", formats[0].first, formats[0].terminal);
    struct ls *s = ls_open("job_later", 4096, SSE_NONE);
    struct ls *later = ls_attach("job_later"); /* the second claim's attempt */
    assert_ptr_equal(later, s);
    ls_close_unfed("job_later"); /* the stale reservation refused, the unattached attempt */
    ls_feed(later, whole, strlen(whole));
    ls_attempt_end(later, 0);
    char *rec = NULL;
    size_t len = 0;
    int complete = 0;
    assert_int_equal(ls_record(later, &rec, &len, &complete), 0);
    assert_true(complete);
    assert_int_equal(len, strlen(whole)); /* nothing dropped */
    free(rec);
    ls_settle(later, 1);
    assert_int_equal(read_all(later, &pos, out, sizeof(out)), LS_END);
    ls_close_own(later);
    ls_release(later);
    ls_release(s);

    struct ls *old = ls_open("job_reopened", 4096, SSE_NONE);
    ls_close_own(old);
    struct ls *fresh = ls_open("job_reopened", 4096, SSE_NONE);
    ls_close_own(old); /* again, late: the stream opened since is not its own */
    struct ls *found = ls_find("job_reopened");
    assert_ptr_equal(found, fresh);
    ls_release(found);
    ls_close_own(fresh);
    assert_null(ls_find("job_reopened"));
    ls_release(fresh);
    ls_release(old);
}

/* Only a job's first attempt feeds its live stream: a resend claimed before the first attempt
 * closed it gets none (it keeps its own body), whether the first attempt's stream ended or not. */
static void test_a_stream_is_fed_by_one_attempt_only(void **state)
{
    (void)state;
    struct ls *s = ls_open("job_resent", 4096, SSE_NONE);
    struct ls *first = ls_attach("job_resent");
    assert_ptr_equal(first, s);
    assert_null(ls_attach("job_resent")); /* while the first still runs */
    ls_feed(first, formats[1].first, strlen(formats[1].first));
    ls_attempt_end(first, 1);
    assert_null(ls_attach("job_resent")); /* ended, not yet closed: the resend's window */
    ls_settle(first, 1);
    ls_close_own(first);
    assert_null(ls_attach("job_resent"));
    ls_release(first);
    ls_release(s);
}

/* A stream longer than its memory share is spooled to an unlinked file: its readers, its record
 * and its batches read the same bytes as from memory, the terminal event is still held until
 * the record, and the file goes with the stream. Each format, fed in pieces of every size from
 * 1 to 7 bytes (events and CRLFs split everywhere). */
static void test_a_spooled_stream_reads_as_one_in_memory(void **state)
{
    (void)state;
    char dir[] = "/tmp/idemgate-ls-XXXXXX";
    assert_non_null(mkdtemp(dir));
    ls_configure(64, dir);
    for (size_t f = 0; f < sizeof(formats) / sizeof(formats[0]); f++)
        for (size_t piece = 1; piece <= 7; piece++) {
            char whole[8192], out[8192], id[32];
            size_t w = 0;
            for (int i = 0; i < 40; i++)
                w += (size_t)snprintf(whole + w, sizeof(whole) - w, "%s", formats[f].first);
            size_t body = w; /* where the terminal event begins */
            w += (size_t)snprintf(whole + w, sizeof(whole) - w, "%s", formats[f].terminal);
            snprintf(id, sizeof(id), "job_s%zu_%zu", f, piece);
            struct ls *s = ls_open(id, sizeof(whole), SSE_NONE);
            size_t pos = 0;
            for (size_t at = 0; at < w; at += piece)
                ls_feed(s, whole + at, w - at < piece ? w - at : piece);
            assert_int_equal(ls_spooled(), 1);
            ls_attempt_end(s, 0);
            assert_int_equal(read_all(s, &pos, out, sizeof(out)), LS_WAIT);
            assert_int_equal(pos, body); /* held: the terminal event waits for the record */
            assert_memory_equal(out, whole, body);
            char *rec = NULL;
            size_t len = 0;
            int ok = 0;
            assert_int_equal(ls_record(s, &rec, &len, &ok), 0);
            assert_int_equal(len, w);
            assert_int_equal(ok, 1);
            assert_memory_equal(rec, whole, w);
            free(rec);
            char part[64];
            assert_int_equal(ls_copy(s, 100, sizeof(part), part), 0);
            assert_memory_equal(part, whole + 100, sizeof(part));
            assert_int_equal(ls_copy(s, w - 10, 11, part), -1); /* past the end */
            ls_settle(s, 1);
            assert_int_equal(read_all(s, &pos, out, sizeof(out)), LS_END);
            assert_int_equal(pos, w);
            assert_memory_equal(out, whole, w);
            ls_close_own(s);
            ls_release(s);
            assert_int_equal(ls_spooled(), 0);
        }
    /* Past max_bytes: what fits is kept, and the record says it is not whole. */
    struct ls *s = ls_open("job_max", 100, SSE_NONE);
    char many[300];
    memset(many, 'x', sizeof(many));
    ls_feed(s, many, sizeof(many));
    char *rec = NULL;
    size_t len = 0;
    int ok = 1;
    assert_int_equal(ls_record(s, &rec, &len, &ok), 0);
    assert_int_equal(len, 100);
    assert_int_equal(ok, 0);
    free(rec);
    ls_close_own(s);
    ls_release(s);
    /* A folder that cannot take the file: the stream stays in memory, whole. */
    ls_configure(64, "/dev/null/spool"); /* under a file: no folder can be made there */
    s = ls_open("job_nospool", 4096, SSE_NONE);
    ls_feed(s, many, sizeof(many));
    assert_int_equal(ls_spooled(), 0);
    assert_int_equal(ls_record(s, &rec, &len, &ok), 0);
    assert_int_equal(len, sizeof(many));
    assert_int_equal(ok, 1);
    free(rec);
    ls_close_own(s);
    ls_release(s);
    ls_configure(0, "");
    assert_int_equal(rmdir(dir), 0); /* nothing was left in it */
}

/* Of a known format, nothing is shown before an event carrying output: a refusal streamed
 * first (an error event after message_start) that the job backs off from is, for its readers,
 * a stream that never began (they wait for the job: its resend's answer); one recorded as the
 * job's end is shown whole. A stream with output shows its events from the first. */
static void test_a_refusal_before_any_output_is_shown_only_as_the_record(void **state)
{
    (void)state;
    static const char start[] = "event: message_start\ndata: {\"type\":\"message_start\","
                                "\"message\":{\"id\":\"msg_1\"}}\n\n";
    static const char refusal[] = "event: error\ndata: {\"type\":\"error\",\"error\":"
                                  "{\"type\":\"overloaded_error\"}}\n\n";
    static const char delta[] = "event: content_block_delta\ndata: {\"type\":"
                                "\"content_block_delta\",\"delta\":{\"text\":\"hi\"}}\n\n";
    for (int recorded = 0; recorded <= 1; recorded++) {
        char id[32], out[1024];
        size_t pos = 0;
        snprintf(id, sizeof(id), "job_refused_%d", recorded);
        struct ls *s = ls_open(id, 4096, SSE_ANTHROPIC);
        assert_non_null(s);
        ls_feed(s, start, strlen(start));
        ls_feed(s, refusal, strlen(refusal));
        ls_attempt_end(s, 1); /* no message_stop: cut, as sse.c reads it */
        assert_int_equal(read_all(s, &pos, out, sizeof(out)), LS_WAIT);
        assert_int_equal(pos, 0);
        assert_int_equal(ls_shown(s), 0);
        ls_settle(s, recorded);
        enum ls_at at = read_all(s, &pos, out, sizeof(out));
        if (recorded) {
            assert_int_equal(ls_shown(s), 1);
            assert_int_equal(at, LS_CUT);
            assert_int_equal(pos, strlen(start) + strlen(refusal));
        } else {
            assert_int_equal(ls_shown(s), 0); /* its readers wait for the job */
            assert_int_equal(ls_began(s), 1); /* its bytes are the attempt's record */
            assert_int_equal(at, LS_NONE);
            assert_int_equal(pos, 0);
        }
        ls_close_own(s);
        ls_release(s);
    }
    /* output after message_start: everything shown from the first event as it comes */
    char out[1024];
    size_t pos = 0;
    struct ls *s = ls_open("job_output", 4096, SSE_ANTHROPIC);
    assert_non_null(s);
    ls_feed(s, start, strlen(start));
    assert_int_equal(read_all(s, &pos, out, sizeof(out)), LS_WAIT);
    assert_int_equal(pos, 0);
    ls_feed(s, delta, strlen(delta));
    assert_int_equal(read_all(s, &pos, out, sizeof(out)), LS_WAIT);
    assert_int_equal(pos, strlen(start) + strlen(delta));
    assert_int_equal(ls_shown(s), 1);
    ls_close_own(s);
    ls_release(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_terminal_event_waits_for_the_record),
        cmocka_unit_test(test_every_form_of_the_terminal_event_is_held),
        cmocka_unit_test(test_an_end_not_recognised_here_still_waits_for_the_record),
        cmocka_unit_test(test_cut_and_closed_streams),
        cmocka_unit_test(test_a_refusal_before_any_output_is_shown_only_as_the_record),
        cmocka_unit_test(test_a_stream_an_attempt_feeds_is_never_closed_by_the_intake),
        cmocka_unit_test(test_a_stream_is_fed_by_one_attempt_only),
        cmocka_unit_test(test_only_the_feeding_attempt_ends_its_stream),
        cmocka_unit_test(test_a_spooled_stream_reads_as_one_in_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
