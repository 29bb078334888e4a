#ifndef IDEMGATE_PRICING_H
#define IDEMGATE_PRICING_H

#include "idemgate/members.h"

#include <cjson/cJSON.h>
#include <stddef.h>

/* What an operation costs, in integer micro-units (1e-6) of a named currency: the estimate
 * reserved against a tenant's budget at intake, and the cost settled at completion from what the
 * provider delivered. A pure module: the price table comes from the provider's profile
 * ("pricing"), the values from the request body, the outputs received and the recorded usage.
 *
 *   "pricing": {
 *     "currency": "USD",
 *     "source": "example prices: verify against the provider's price page",
 *     "per_request": 0,                       micro-units per completed request
 *     "per_output": 40000,                    micro-units per output delivered (image, clip…)
 *     "per_output_by": {"keys": ["$.quality", "$.size"], "defaults": ["auto", "1024x1024"],
 *                       "prices": {"high|1024x1024": 167000, "low|1024x1024": 11000}},
 *     "per_second": 100000,                   micro-units per second of each output delivered
 *     "per_second_by": {"keys": ["$.model", "$.size"], "defaults": ["sora-2", "720x1280"],
 *                       "prices": {"sora-2-pro|1024x1792": 500000}},
 *     "seconds": "$.seconds", "default_seconds": 8,
 *     "per_million_input_tokens": 5000000, "per_million_output_tokens": 40000000,
 *     "input_tokens": "$.input_tokens", "output_tokens": "$.output_tokens",  (in the usage)
 *     "estimate_input_tokens": 0, "estimate_output_tokens": 0,
 *     "usage_settles": false,
 *     "per_megapixel": 25000, "width": "$.image_size.width", "height": "$.image_size.height",
 *     "megapixel": 1000000,
 *     "variants": {"keys": ["$.model"], "defaults": ["gpt-image-1"],
 *                  "tables": {"gpt-image-1-mini": { …the members above… }}},
 *     "fallback_per_output": 200000
 *   }
 *
 * per_output_by picks the price per output by request values joined with "|" (a value the body
 * lacks takes its default; a key the table lacks falls back to per_output); per_second_by the
 * price per second the same way (falling back to per_second). Seconds are read from the request
 * body (a number, or a string holding one, as OpenAI's "seconds": "8"). per_megapixel prices each
 * output by its pixels, rounded up to whole megapixels, when the request gives both width and
 * height (a custom size); otherwise the per-output price applies. usage_settles: a provider that
 * bills by tokens and publishes per-output figures as their average (OpenAI's image models) is
 * estimated at intake by the per-output table and settled at completion by the tokens the usage
 * reports — by the estimate (the per-output table and the estimated tokens) when the usage
 * reports none, never 0. variants: a whole price
 * table per request value (a model); a value no variant names is priced by the top-level members.
 * A request that no variant names while the top-level members price nothing is *unpriced* (a
 * model the table does not list): it would cost 0, so under a tenant's amount budget it is
 * refused (issue 21 §7) — unless the table sets fallback_per_output (top level only), the price
 * per output of such a request, which then is priced by it like any other. Every sum saturates
 * at PRICE_MAX rather than overflow (an amount read from a table or a limit is at most that),
 * and a job's price — its estimate, its cost — at PRICE_JOB_MAX: 2^53 micro-units, so that the
 * database's sums of reservations and costs (bigint) hold a thousand saturated jobs — at 2^60,
 * eight in flight overflowed a tenant's budget row and its intakes answered 5xx until they
 * ended. */

#define PRICE_MAX_BY 4
#define PRICE_MAX_ASKED 4 /* paths of output_tokens_requested */
#define PRICE_MAX ((long long)1 << 60)
#define PRICE_JOB_MAX ((long long)1 << 53)

struct jpath;

struct price_entry {
    char *key; /* request values joined with '|' */
    long long micros;
};

/* Request values as a key: keys (JSONPaths into the request) whose values are joined with
 * '|'; a value the request lacks takes its default. */
struct price_keys {
    struct jpath *paths[PRICE_MAX_BY];
    char *defaults[PRICE_MAX_BY];
    int n; /* 0: none */
};

/* A price chosen by request values: the entry of prices the key names. */
struct price_by {
    struct price_keys k;
    struct price_entry *prices;
    size_t n_prices;
};

struct price_variant;

/* variants.default_when: the variant a request that names none is priced by when one of its
 * conditions holds ("$.background": present and not null; "$.quality=high": that value), before
 * variants.defaults — an API whose default model depends on the parameters used (OpenAI's images:
 * dall-e-2 unless a GPT image parameter is given). */
#define PRICE_MAX_WHEN 4
#define PRICE_MAX_WHEN_IF 16
struct price_when {
    char *variant;
    size_t n;
    struct jpath *paths[PRICE_MAX_WHEN_IF];
    char *values[PRICE_MAX_WHEN_IF]; /* NULL: the member is present */
};

struct price_table {
    int present; /* 0: the provider has no price table; every cost is 0 and no currency */
    char *currency;
    char *source;
    long long per_request;
    long long per_output;
    struct price_by output_by;
    long long per_megapixel;         /* replaces the per-output price when width and height */
    struct jpath *width, *height;    /* are both in the request */
    long long megapixel;             /* pixels in a megapixel (default 1 000 000) */
    long long per_second;
    struct price_by second_by;
    struct jpath *seconds;
    double default_seconds;
    long long per_mtok_in, per_mtok_out;
    struct jpath *tokens_in, *tokens_out;
    long long estimate_tokens_in, estimate_tokens_out;
    /* Where the request says the most output tokens it allows ("$.max_tokens"; several paths
     * for an API that takes the bound under two names, the first that holds a number counting):
     * the estimate's output tokens when one holds a number >= 0 (else estimate_tokens_out). */
    struct jpath *tokens_out_asked[PRICE_MAX_ASKED];
    /* Where the request says how many completions it asks for ("$.n", 1 to 128; else 1): the
     * estimate's output tokens are that many times the above; or NULL. */
    struct jpath *choices;
    int usage_settles; /* the cost at completion is the usage's tokens alone when it has them */
    struct price_keys variant_keys;  /* a whole table per request value (the model) */
    struct price_variant *variants;
    size_t n_variants;
    struct price_when when[PRICE_MAX_WHEN]; /* variants.default_when (one variant key only) */
    size_t n_when;
    long long fallback_per_output; /* the price per output of an unlisted request, when */
    int has_fallback;              /* fallback_per_output is set (top level only) */
};

struct price_variant {
    char *key;
    struct price_table table; /* its currency and source are the parent's */
};

/* The member names of a "pricing" object, nested tables included (members.h); profile.c checks a
 * provider's members against them before price_table_load reads them. */
extern const struct memb_table price_table_members;

/* Reads a profile's "pricing" object (NULL: no price table) into t. Returns 0, or -1 with a
 * message naming the member ("pricing.per_output: …") in err. */
__attribute__((warn_unused_result)) int price_table_load(const cJSON *j, struct price_table *t,
                                                         char *err, size_t errlen);
void price_table_fini(struct price_table *t);

/* The estimate reserved at intake: per request, plus the price per output × seconds factor ×
 * outputs requested, plus the estimated tokens. body is the parsed request (may be NULL);
 * outputs_requested < 1 counts as 1. */
long long price_estimate(const struct price_table *t, const cJSON *body, int outputs_requested);

/* The cost at completion of what the provider delivered: outputs_received (-1: not counted, then
 * outputs_requested, then 1) priced as in price_estimate, and the tokens the recorded usage
 * (may be NULL) reports — the estimate's tokens when it reports none. A partial result costs its
 * delivered outputs only. */
long long price_actual(const struct price_table *t, const cJSON *body, int outputs_requested,
                       int outputs_received, const cJSON *usage);

/* The same from raw bytes: the request body (len bytes, JSON, may be unparsable: then no
 * request values are known) and the usage as recorded (JSON text or NULL); *is_unlisted (when
 * not NULL) as price_unlisted_raw says, from the same parse. */
long long price_estimate_raw(const struct price_table *t, const char *body, size_t len,
                             int outputs_requested);
/* Whether a job recorded in `recorded` (its currency at its intake; NULL or "": none then)
 * may be priced by t: only in its own currency. A price table whose currency changed since —
 * USD then, JPY now — would write an amount in yen on a dollar row, settled against the dollar
 * budget (thousands of dollars counted, the tenant refused for the month; or the reverse, its
 * counters clamped at 0). Such a job keeps its estimate as its cost. Pure. */
int price_currency_fits(const struct price_table *t, const char *recorded);
long long price_actual_raw(const struct price_table *t, const char *body, size_t len,
                           int outputs_requested, int outputs_received, const char *usage,
                           int *is_unlisted);

/* 1 when the request is unpriced, with no fallback_per_output: the table has variants, the
 * request's values name none of them and the top-level members price nothing (a model the
 * table does not list); or a per_output_by / per_second_by names none of the request's values
 * and no flat price (per_output, per_megapixel / per_second) stands beside it (a model and size
 * pair a video table does not list) — it would cost 0, or its seconds 0. Such a request is
 * refused under a tenant's amount budget
 * and, without one, counted (idemgate_unpriced_operations_total). body: the raw request (len
 * bytes). */
int price_unlisted_raw(const struct price_table *t, const char *body, size_t len);

/* A decimal amount of currency units ("12", "0.5", "3.000001") as micro-units. Returns 0, or -1
 * when s is not a non-negative decimal with at most 6 fractional digits below PRICE_MAX. */
__attribute__((warn_unused_result)) int price_parse_amount(const char *s, long long *micros);

/* micros as a decimal amount with 6 fractional digits ("12.500000"); returns buf. */
char *price_format(long long micros, char *buf, size_t len);

#endif
