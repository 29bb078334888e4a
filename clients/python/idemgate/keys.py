"""Idempotency keys derived from the identity of the wanted output, never from a random value.

Ask which inputs, if they changed, would make you want a different output (product, template
version, prompt version, language, variant…): exactly those go into the identity. The key is
the SHA-256 of the identity's canonical JSON (RFC 8785 for the types allowed here: object
members sorted by UTF-16 code units, no spaces, strings escaped minimally), so any program in
any language that canonicalises the same identity gets the same key.
"""

import hashlib
import json
import re

_PREFIX = re.compile(r"[A-Za-z0-9._:-]{0,128}")
_MAX_SAFE = 2 ** 53


def _canon(v, out, path):
    if v is None or v is True or v is False:
        out.append(json.dumps(v))
    elif isinstance(v, int):
        if abs(v) > _MAX_SAFE:
            raise TypeError(f"{path}: integer beyond 2^53 is not portable: use a string")
        out.append(str(v))
    elif isinstance(v, float):
        raise TypeError(f"{path}: a float's spelling differs across languages: use a string "
                        "or an integer")
    elif isinstance(v, str):
        out.append(json.dumps(v, ensure_ascii=False))
    elif isinstance(v, (list, tuple)):
        out.append("[")
        for i, x in enumerate(v):
            if i:
                out.append(",")
            _canon(x, out, f"{path}[{i}]")
        out.append("]")
    elif isinstance(v, dict):
        for k in v:
            if not isinstance(k, str):
                raise TypeError(f"{path}: member names must be strings")
        out.append("{")
        for i, k in enumerate(sorted(v, key=lambda s: s.encode("utf-16-be"))):
            if i:
                out.append(",")
            out.append(json.dumps(k, ensure_ascii=False))
            out.append(":")
            _canon(v[k], out, f"{path}.{k}")
        out.append("}")
    else:
        raise TypeError(f"{path}: {type(v).__name__} is not part of an identity")


def canonical_json(value):
    """The canonical JSON text of an identity (str). Floats and integers beyond 2^53 are
    refused (TypeError): they do not spell the same in every language."""
    out = []
    _canon(value, out, "$")
    return "".join(out)


def derive_key(identity, fields=None, prefix=""):
    """The Idempotency-Key of the output that identity names.

    identity: a dict. fields: the names of its members that make up the identity (all of
    them when None); a named field that is missing raises KeyError, since a key built from a
    partial identity would merge different outputs. prefix: an optional readable prefix for
    logs ([A-Za-z0-9._:-], at most 128 characters).

    Returns prefix + 64 hex digits. The same identity always gives the same key, in any
    process, on any machine; member order does not matter."""
    if not isinstance(identity, dict):
        raise TypeError("identity must be a dict")
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ValueError("prefix: at most 128 of [A-Za-z0-9._:-]")
    if fields is not None:
        missing = [f for f in fields if f not in identity]
        if missing:
            raise KeyError(f"identity lacks {', '.join(missing)}")
        identity = {f: identity[f] for f in fields}
    if not identity:
        raise ValueError("an empty identity would give every output the same key")
    text = canonical_json(identity)
    return prefix + hashlib.sha256(text.encode("utf-8")).hexdigest()
