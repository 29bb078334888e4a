// Idempotency keys derived from the identity of the wanted output, never from a random value.
//
// Ask which inputs, if they changed, would make you want a different output (product, template
// version, prompt version, language, variant…): exactly those go into the identity. The key is
// the SHA-256 of the identity's canonical JSON (RFC 8785 for the values allowed here: object
// members sorted by UTF-16 code units, no spaces, strings escaped minimally), so the Python
// client (clients/python, `derive_key`) and any other program that canonicalises the same
// identity gets the same key.

import { createHash } from "node:crypto";

/** The values an identity may hold. Non-integer numbers are refused: their spelling differs
 *  across languages (use a string). */
export type IdentityValue = string | number | boolean | null | IdentityValue[] | { [name: string]: IdentityValue };
export type Identity = { [name: string]: IdentityValue };

const PREFIX = /^[A-Za-z0-9._:-]{0,128}$/;
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function isPlainObject(v: unknown): v is Record<string, unknown> {
  if (v === null || typeof v !== "object") return false;
  const proto = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
}

function canon(v: unknown, out: string[], path: string): void {
  if (v === null || v === true || v === false) {
    out.push(String(v));
  } else if (typeof v === "number") {
    if (!Number.isInteger(v)) {
      throw new TypeError(`${path}: a non-integer number's spelling differs across languages: use a string`);
    }
    if (!Number.isSafeInteger(v)) {
      throw new TypeError(`${path}: an integer beyond 2^53 is not portable: use a string`);
    }
    out.push(String(v));
  } else if (typeof v === "string") {
    if (LONE_SURROGATE.test(v)) throw new TypeError(`${path}: a string with a lone surrogate is not Unicode text`);
    out.push(JSON.stringify(v));
  } else if (Array.isArray(v)) {
    out.push("[");
    v.forEach((x, i) => {
      if (i) out.push(",");
      canon(x, out, `${path}[${i}]`);
    });
    out.push("]");
  } else if (isPlainObject(v)) {
    const o = v;
    // Default string order compares UTF-16 code units, as RFC 8785 asks.
    const names = Object.keys(o).sort();
    out.push("{");
    names.forEach((k, i) => {
      if (LONE_SURROGATE.test(k)) throw new TypeError(`${path}: a member name with a lone surrogate`);
      if (i) out.push(",");
      out.push(JSON.stringify(k), ":");
      canon(o[k], out, `${path}.${k}`);
    });
    out.push("}");
  } else {
    const what = v === undefined ? "undefined" : typeof v === "object" ? (v.constructor?.name ?? "object") : typeof v;
    throw new TypeError(`${path}: ${what} is not part of an identity`);
  }
}

/** The canonical JSON text of an identity. Non-integers, integers beyond 2^53, undefined,
 *  functions, dates and other objects that are not plain are refused (TypeError). */
export function canonicalJson(value: unknown): string {
  const out: string[] = [];
  canon(value, out, "$");
  return out.join("");
}

export interface DeriveKeyOptions {
  /** The names of the identity's members that make up the key (all of them when absent). A
   *  named field that is missing throws: a key built from a partial identity would merge
   *  different outputs. */
  fields?: readonly string[];
  /** A readable prefix for logs ([A-Za-z0-9._:-], at most 128 characters). */
  prefix?: string;
}

/** The Idempotency-Key of the output `identity` names: prefix + 64 hex digits of the SHA-256 of
 *  its canonical JSON. The same identity always gives the same key, in any process, on any
 *  machine, in this client or the Python one; member order does not matter. */
export function deriveKey(identity: Identity, options: DeriveKeyOptions = {}): string {
  if (identity === null || typeof identity !== "object" || Array.isArray(identity)) {
    throw new TypeError("identity must be an object");
  }
  const prefix = options.prefix ?? "";
  if (typeof prefix !== "string" || !PREFIX.test(prefix)) {
    throw new RangeError("prefix: at most 128 of [A-Za-z0-9._:-]");
  }
  let id: Record<string, unknown> = identity;
  if (options.fields !== undefined) {
    const missing = options.fields.filter((f) => !Object.prototype.hasOwnProperty.call(identity, f));
    if (missing.length) throw new RangeError(`identity lacks ${missing.join(", ")}`);
    id = Object.fromEntries(options.fields.map((f) => [f, identity[f]]));
  }
  if (Object.keys(id).length === 0) {
    throw new RangeError("an empty identity would give every output the same key");
  }
  return prefix + createHash("sha256").update(canonicalJson(id), "utf8").digest("hex");
}
