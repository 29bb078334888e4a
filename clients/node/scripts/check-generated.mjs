#!/usr/bin/env node
// Fails (exit 1) when src/generated/openapi.ts is not what openapi-typescript makes of the spec
// today: a change to docs/openapi.yaml that forgets this client fails here, and `tsc --noEmit`
// then says what in the client no longer fits (`npm run generate` rewrites the file).
//   node scripts/check-generated.mjs [SPEC] [GENERATED]
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(dirname(fileURLToPath(import.meta.url)));
const spec = resolve(process.argv[2] ?? join(here, "..", "..", "docs", "openapi.yaml"));
const committed = resolve(process.argv[3] ?? join(here, "src", "generated", "openapi.ts"));
const tmp = mkdtempSync(join(tmpdir(), "idemgate-openapi-"));
try {
  const fresh = join(tmp, "openapi.ts");
  const r = spawnSync(join(here, "node_modules", ".bin", "openapi-typescript"), [spec, "-o", fresh],
                      { encoding: "utf8", timeout: 120000 });
  if (r.status !== 0) {
    process.stderr.write(`openapi-typescript failed on ${spec} (exit ${r.status}):\n${r.stderr}${r.error ?? ""}\n`);
    process.exit(2);
  }
  const want = readFileSync(fresh, "utf8");
  const have = readFileSync(committed, "utf8");
  if (want !== have) {
    const a = have.split("\n"), b = want.split("\n");
    let i = 0;
    while (i < a.length && i < b.length && a[i] === b[i]) i++;
    process.stderr.write(`${committed} is not generated from ${spec}: they differ from line ${i + 1}\n` +
                         `  committed: ${a[i] ?? "(end of file)"}\n  spec:      ${b[i] ?? "(end of file)"}\n` +
                         "Run `npm run generate` in clients/node, then `npm run check-types`, and fix the client.\n");
    process.exit(1);
  }
  process.stdout.write(`${committed} matches ${spec}\n`);
} finally {
  rmSync(tmp, { recursive: true, force: true });
}
