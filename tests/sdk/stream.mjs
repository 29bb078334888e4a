// The OpenAI Node SDK, unmodified, streaming a chat completion through idemgate: only its base
// URL changes, and the Idempotency-Key goes through the SDK's per-request headers option.
//   node stream.mjs BASE_URL TOKEN KEY [EXTRA_BODY_JSON]
//   → {"chunks": n, "text": "...", "usage": {...}, "first_ms": ms to the first chunk}
import OpenAI from "openai";

const [baseURL, apiKey, key, extra] = process.argv.slice(2);
const client = new OpenAI({ apiKey, baseURL, maxRetries: 0, timeout: 60_000 });
const t0 = Date.now();
const stream = await client.chat.completions.create(
  {
    model: "gpt-4o-mini",
    messages: [{ role: "user", content: "Say hello" }],
    stream: true,
    stream_options: { include_usage: true },
    ...JSON.parse(extra || "{}"),
  },
  { headers: { "Idempotency-Key": key } },
);
let chunks = 0, text = "", usage = null, firstMs = null;
for await (const chunk of stream) {
  if (firstMs === null) firstMs = Date.now() - t0;
  chunks++;
  for (const c of chunk.choices ?? []) text += c.delta?.content ?? "";
  if (chunk.usage) usage = chunk.usage;
}
console.log(JSON.stringify({ chunks, text, usage, first_ms: firstMs }));
