#ifndef IDEMGATE_SSE_H
#define IDEMGATE_SSE_H

#include <stddef.h>

/* Server-sent event streams of the LLM APIs (PROVIDERS.md "LLM text and uploads"): whether a
 * recorded stream reached its terminal event, whether it carried an error event, and the usage
 * it reported, read the same way for a stream that is whole and one that was cut. A pure module:
 * no I/O.
 *
 * A stream is complete only when its terminal event arrived: `data: [DONE]` (OpenAI Chat
 * Completions), `event: message_stop` (Anthropic Messages), `response.completed` (OpenAI
 * Responses; `response.failed` and `response.incomplete` end it too, as the provider's own
 * verdict). A stream cut before it was paid for whatever it generated and is ambiguous. */

enum sse_format {
    SSE_NONE = 0,
    SSE_OPENAI_CHAT,      /* "openai-chat" */
    SSE_ANTHROPIC,        /* "anthropic" */
    SSE_OPENAI_RESPONSES, /* "openai-responses" */
};

/* The format named by a profile's "stream" member; -1 when the name is unknown. */
int sse_format_parse(const char *name);
const char *sse_format_name(enum sse_format f);

struct sse_verdict {
    int events;   /* complete events read (a last one without its blank line is not counted) */
    int terminal; /* the terminal event arrived */
    int error;    /* an error event arrived (Anthropic `event: error`, an OpenAI `error` member,
                     `response.failed`) */
    /* The usage as the provider reports it in a whole (non-streamed) answer, merged from the
     * events that carry it: OpenAI Chat's last chunk's `usage`, Anthropic's
     * message_start.message.usage overlaid with message_delta.usage, the Responses API's
     * response.usage. A malloc'ed JSON object text, or NULL when no event carried one. */
    char *usage;
    /* An event carrying generated output (a delta with text or a tool call, a content block,
     * an output item) arrived before the first error event, or at all when there was none. */
    int output;
    /* The first error event's type (Anthropic error.type; OpenAI error.code, else error.type;
     * a failed response's error.code), "" when none or unnamed; and the HTTP status it stands
     * for (sse_error_status), 0 when the type is not one we know. */
    char error_type[48];
    int error_status;
    /* The provider's id for this generation, from the first event naming one (a Responses
     * event's response.id, Anthropic's message_start.message.id, an OpenAI chunk's id); ""
     * when none did, or it is longer than fits. Where the provider keeps the generation
     * (Responses, stored by default), a cut stream is read back by it. */
    char id[128];
};

/* The HTTP status an error event's type stands for, as the provider answers the same refusal
 * before a stream begins ("overloaded_error" 529, "rate_limit_error" 429, "invalid_request_error"
 * 400, "api_error" 500…); 0 for a type not known here, or NULL. */
int sse_error_status(const char *type);

/* Reads body[0..len) (may be NULL when len is 0) as a stream of format f into *v. Returns 0,
 * or -1 when out of memory (*v then holds no usage). */
int sse_read(enum sse_format f, const char *body, size_t len, struct sse_verdict *v);
void sse_verdict_fini(struct sse_verdict *v);

/* The top-level request members that choose how the answer is delivered, not what is
 * generated ("stream", "stream_options"): left out of the fingerprint, so that the same request
 * asked streamed and whole is one job (its record is served either way: sse_assemble,
 * sse_synthesize). NULL-terminated. */
extern const char *const sse_delivery_members[];

/* The whole answer a complete recorded stream stands for, as the provider answers the same
 * request without "stream" (text content, stop reason, usage; OpenAI Chat: a
 * chat.completion; Anthropic: a message; Responses: the completed response): malloc'ed JSON
 * (*out_len bytes), or NULL when the stream is not complete or memory ran out. */
char *sse_assemble(enum sse_format f, const char *body, size_t len, size_t *out_len);
/* The event stream a whole answer stands for, in format f (the text in one delta per block,
 * then the stop reason, the usage and the terminal event): malloc'ed (*out_len bytes), or NULL
 * when json is not such an answer or memory ran out. */
char *sse_synthesize(enum sse_format f, const char *json, size_t len, size_t *out_len);

/* 1 when the request body (JSON text) is an object whose top-level member name is true. */
int sse_body_flag(const char *body, size_t len, const char *name);

/* 1 when the request body (JSON text) asks the provider for a stream: its top-level "stream"
 * member is true. A body that is not a JSON object asks for none. */
int sse_requested(const char *body, size_t len);

/* The last whole event of body[0..len): returns 1 with *end the offset just past the blank line
 * that ends it (body[0..*end) is every whole event, nothing of one cut off) and its data in
 * *data (malloc'ed, NUL-terminated, *dlen bytes; "" when it had none); 0 when body holds no
 * whole event; -1 when out of memory. */
int sse_last_event(const char *body, size_t len, size_t *end, char **data, size_t *dlen);

#endif
