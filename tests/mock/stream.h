#ifndef IDEMGATE_MOCK_STREAM_H
#define IDEMGATE_MOCK_STREAM_H

#include "mock.h"

#include <microhttpd.h>

/*
 * idemgate-mock: the LLM text APIs, streamed as server-sent events when the body asks
 * "stream": true, else answered whole.  Every create lands in the ledger like any other.
 *
 *   POST /v1/chat/completions  OpenAI Chat Completions: `data: {chunk}` events, then (with
 *                              stream_options.include_usage) a chunk holding the usage, then
 *                              `data: [DONE]`
 *   POST /v1/messages          Anthropic Messages (needs anthropic-version): message_start,
 *                              content_block_*, ping, message_delta (usage), message_stop
 *   POST /v1/responses         OpenAI Responses: response.created, response.in_progress,
 *                              response.output_text.delta…, response.output_text.done,
 *                              response.completed (the whole response, usage included)
 *
 * Controls in the body's "_mock" object: "events" (text deltas, default 3), "event_delay_ms"
 * (before each event), "cut_after" (the connection is closed after that many events, with no
 * terminal event), "error_after" (an error event after that many events, then the end:
 * Anthropic's overloaded_error, OpenAI's error chunk), "error_code" (OpenAI Chat: the error
 * chunk's code and type, 1..64 bytes of [a-z_]; default server_error), "reasoning" (OpenAI Chat:
 * the deltas are reasoning_content, as compatible providers stream a model's reasoning, instead
 * of content), "unterminated" (true: the whole stream, then the connection is closed without the
 * chunked body's last chunk), "error_first" (the first N creates of
 * the same body get that error event right after the preamble, before any output; the next are
 * whole streams), "status" (an error answer of that status
 * instead of any stream, with Retry-After: 0 for 429/529).
 */
enum MHD_Result stream_handle_chat(struct mock_request *req);
enum MHD_Result stream_handle_messages(struct mock_request *req);
enum MHD_Result stream_handle_responses(struct mock_request *req);
/* GET /v1/responses/{id}: a response created with "store" not false (the provider's default),
 * read back: "in_progress" for the first "reads_in_progress" reads its create's "_mock" asked
 * for, then completed whole (the same text and usage as its stream); 404 for any other id.
 * A response whose stream ended with an error event, or created with "_mock": {"fail": true},
 * reads back "failed" (once its reads in progress are spent).
 * POST /v1/responses/{id}/cancel: a response still in progress is "cancelled" from then on (one
 * that completed stays completed). A create with "background": true (non-streamed) is answered
 * at once "queued"; with "store": false it is refused 400, as OpenAI does. */
enum MHD_Result stream_handle_response_get(struct mock_request *req);
/* Forgets the kept responses and the creates counted per body (POST /_reset: the sequence
 * numbers restart). */
void stream_reset(void);

#endif
