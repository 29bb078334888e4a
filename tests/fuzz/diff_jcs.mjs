// Differential check of the RFC 8785 canonical form: src/jcs.c (through tool_jcs_canon's list)
// against the npm package `canonicalize` (JSON.parse + ECMAScript serialisation).
//   node diff_jcs.mjs NODE_MODULES LIST.tsv
// For every input jcs accepts:
// - JSON.parse must accept it too, and canonicalize(JSON.parse(ours)) must equal
//   canonicalize(JSON.parse(input)): the same document, whatever the spelling;
// - ours must equal canonicalize's output token for token, except that a number may be spelt
//   differently when both spellings have the same IEEE value: jcs keeps exact decimal values
//   (9007199254740993, 0.10000000000000001), a documented deviation (include/idemgate/jcs.h).
// Exits 1 on any other difference, printing the first few.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { resolve } from 'node:path';

const [modules, list] = process.argv.slice(2);
const canonicalize = createRequire(`${resolve(modules)}/`)('canonicalize');
const TOKEN = /"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|[{}[\]:,]|true|false|null/gy;

function tokens(s) {
  const out = [];
  TOKEN.lastIndex = 0;
  while (TOKEN.lastIndex < s.length) {
    const m = TOKEN.exec(s);
    if (!m) return null;
    out.push(m[0]);
  }
  return out;
}

const isNumber = (t) => /^-?\d/.test(t);
let accepted = 0, refused = 0, identical = 0, numbers = 0;
const failures = [];
for (const line of readFileSync(list, 'utf8').split('\n')) {
  if (!line) continue;
  const [path, b64] = line.split('\t');
  if (b64 === '-') { refused++; continue; }
  accepted++;
  const ours = Buffer.from(b64, 'base64').toString('utf8');
  let ref, again;
  try {
    ref = canonicalize(JSON.parse(readFileSync(path, 'utf8')));
    again = canonicalize(JSON.parse(ours));
  } catch (e) {
    failures.push(`${path}: JSON.parse refuses what jcs accepted (${e.message})`);
    continue;
  }
  if (again !== ref) {
    failures.push(`${path}: a different document\n  jcs:       ${ours}\n  reference: ${ref}`);
    continue;
  }
  if (ours === ref) { identical++; continue; }
  const a = tokens(ours), b = tokens(ref);
  const ok = a && b && a.length === b.length && a.every((t, i) =>
    t === b[i] || (isNumber(t) && isNumber(b[i]) && Number(t) === Number(b[i])));
  if (ok) numbers++;
  else failures.push(`${path}: not the reference's canonical form\n  jcs:       ${ours}\n  reference: ${ref}`);
}
console.log(`jcs vs npm canonicalize: ${accepted} inputs accepted by jcs (${refused} refused): ` +
  `${identical} byte-identical, ${numbers} differing only in exact number spelling, ` +
  `${failures.length} differences`);
for (const f of failures.slice(0, 5)) console.log(`  DIFF ${f}`);
process.exit(failures.length ? 1 : 0);
