// Cancel of a job that was never sent, against a gateway with no dispatch workers (started by
// tests/integration/test_node_client.py with IDEMGATE_URL, IDEMGATE_TOKEN, IDEMGATE_MOCK_URL).
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { Client, OutputsUnavailable, deriveKey } from "../dist/index.js";

const env = process.env;
const skip = env.IDEMGATE_URL ? false : "IDEMGATE_URL is not set (run by tests/integration/test_node_client.py)";

test("cancel before sending fails the job at once, idempotently, with no create", { skip }, async () => {
  const c = new Client({ baseUrl: env.IDEMGATE_URL, token: env.IDEMGATE_TOKEN });
  const key = deriveKey({ test: "cancel-idle", run: randomUUID() }, { prefix: "node-" });
  const h = await c.submit(env.IDEMGATE_SYNC_ROUTE, { prompt: "never mind" }, key);
  assert.equal(h.state, "prepared");
  const gone = await c.cancel(h);
  assert.equal(gone.state, "failed");
  assert.ok(gone.terminal && gone.job.cancel_requested_at, JSON.stringify(gone.job));
  assert.equal((await c.cancel(h.id)).state, "failed", "cancel is idempotent");
  assert.equal((await c.wait(h.id, { timeoutSeconds: 5 })).state, "failed");
  await assert.rejects(c.outputs(h.id), OutputsUnavailable);
  const ledger = await (await fetch(`${env.IDEMGATE_MOCK_URL}/_ledger`)).json();
  assert.deepEqual(ledger.creates.filter((e) => e.client_ref === h.id), []);
});
