// The OpenAI Node SDK, unmodified, pointed at idemgate: only its base URL changes, and the
// Idempotency-Key goes through the SDK's per-request headers option.
//   node dropin.mjs BASE_URL TOKEN KEY PROMPT [EXTRA_BODY_JSON]  → the SDK's answer as JSON
import OpenAI from "openai";

const [baseURL, apiKey, key, prompt, extra] = process.argv.slice(2);
const client = new OpenAI({ apiKey, baseURL, maxRetries: 2, timeout: 60_000 });
const image = await client.images.generate(
  { model: "gpt-image-1", prompt, n: 1, size: "1024x1024", ...JSON.parse(extra || "{}") },
  { headers: { "Idempotency-Key": key } },
);
console.log(JSON.stringify(image));
