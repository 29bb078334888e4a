// The OpenAI Node SDK, unmodified, meeting the gateway's errors: each call is made with the SDK
// (no retries) and what the SDK hands its caller is printed — the error's class, status,
// message, code and type, and the `error` object it parsed from the body.
//   node errors.mjs CALLS_JSON  → a JSON array, one outcome per call
// A call: {"base": URL, "token": T, "kind": "images" | "get" | "post", "path": P,
//          "body": {…}, "headers": {…}}
import OpenAI from "openai";

const calls = JSON.parse(process.argv[2]);
const out = [];
for (const c of calls) {
  const client = new OpenAI({ apiKey: c.token, baseURL: c.base, maxRetries: 0, timeout: 60_000 });
  const opts = { headers: c.headers || {} };
  try {
    let answer;
    if (c.kind === "images") answer = await client.images.generate(c.body, opts);
    else if (c.kind === "get") answer = await client.get(c.path, opts);
    else answer = await client.post(c.path, { ...opts, body: c.body });
    out.push({ ok: true, answer });
  } catch (e) {
    out.push({
      ok: false,
      name: e.constructor.name,
      status: e.status ?? null,
      message: e.message,
      code: e.code ?? null,
      type: e.type ?? null,
      error: e.error ?? null,
    });
  }
}
console.log(JSON.stringify(out));
