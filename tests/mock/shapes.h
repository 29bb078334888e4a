/*
 * idemgate-mock: what the real asynchronous job APIs look like: their status labels, JSON
 * objects, results, cancels, lists, errors and webhooks, one struct async_kind each.  The
 * personality table in providers.c points at these.
 */
#ifndef IDEMGATE_MOCK_SHAPES_H
#define IDEMGATE_MOCK_SHAPES_H

#include "async.h"

/* OpenAI videos: POST /v1/videos, GET /v1/videos/{id}, .../content, list. */
extern const struct async_kind shape_openai_videos;
/* Replicate predictions: 201 create, urls.get/cancel, Standard Webhooks. */
extern const struct async_kind shape_replicate;
/* fal queue: request_id and status/response/cancel URLs, Ed25519 webhooks. */
extern const struct async_kind shape_fal;
/* Runway tasks: X-Runway-Version, PENDING..SUCCEEDED, DELETE cancels. */
extern const struct async_kind shape_runway;
/* Luma Dream Machine generations: states queued/dreaming/completed, unsigned callbacks. */
extern const struct async_kind shape_luma;
/* Vertex AI Veo long-running operations: predictLongRunning, POST fetchPredictOperation. */
extern const struct async_kind shape_vertex;
/* A provider that dedupes on Idempotency-Key (Higgsfield/Argil style), hex HMAC webhooks. */
extern const struct async_kind shape_keyed;

#endif
