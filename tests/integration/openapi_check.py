"""Checks real HTTP responses against docs/openapi.yaml.

A small validator for the subset of OpenAPI 3.1 / JSON Schema 2020-12 the spec uses (no
third-party validator is needed): type (with "null" and type lists), required, properties,
additionalProperties, enum, const, items, $ref (to #/components/...), allOf, oneOf, anyOf,
minimum/maximum, minLength/maxLength, pattern, and format date-time.

It is stricter than JSON Schema in one way, on purpose: an object whose schema lists its
properties may not carry undocumented ones unless the schema sets additionalProperties. A field
added to a response without being documented is drift, and fails.

How a response is matched (the spec's root description says the same):
  1. the path and method select an operation; a path that matches none is checked against the
     root `x-unmatched-path` response, a known path with another method against
     `x-unmatched-method`;
  2. a response that carries X-Idemgate-Job-Id is the provider's stored answer, checked
     against the operation's `x-passthrough` response;
  3. otherwise the status code selects the response (exact, then 2XX-style range, then
     `default`); an undocumented status is an error.
"""

import datetime
import os
import re

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SPEC_PATH = os.path.join(ROOT, "docs", "openapi.yaml")
PROBLEM_PREFIX = "urn:idemgate:problem:"
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def load_spec(path=SPEC_PATH):
    with open(path) as f:
        return yaml.safe_load(f)


class Checked:
    """The outcome of checking one response: where it matched and what was wrong."""

    def __init__(self, op_id, status_key, problem_type, errors):
        self.op_id = op_id            # operationId, or "x-unmatched-path" / "x-unmatched-method"
        self.status_key = status_key  # "202", "4XX", "x-passthrough", …
        self.problem_type = problem_type
        self.errors = errors

    def __repr__(self):
        return f"<{self.op_id} {self.status_key} {self.problem_type} errors={self.errors}>"


class Spec:
    def __init__(self, doc=None):
        self.doc = doc if doc is not None else load_spec()
        self._paths = []
        for template, item in self.doc.get("paths", {}).items():
            self._paths.append((template, item, self._compile(template, item)))

    # ---- references -------------------------------------------------------------------
    def resolve(self, node):
        seen = 0
        while isinstance(node, dict) and "$ref" in node:
            ref = node["$ref"]
            if not ref.startswith("#/"):
                raise ValueError(f"only local $ref are supported: {ref}")
            target = self.doc
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    raise KeyError(f"unresolvable $ref {ref}")
                target = target[part]
            node = target
            seen += 1
            if seen > 32:
                raise ValueError(f"$ref loop at {ref}")
        return node

    # ---- routing ----------------------------------------------------------------------
    def _compile(self, template, item):
        params = {}
        for p in item.get("parameters", []):
            p = self.resolve(p)
            params[p["name"]] = p
        for m in HTTP_METHODS:
            for p in (item.get(m) or {}).get("parameters", []):
                p = self.resolve(p)
                if p.get("in") == "path":
                    params[p["name"]] = p
        out = ""
        for piece in re.split(r"(\{[^}]+\})", template):
            if piece.startswith("{"):
                name = piece[1:-1]
                greedy = params.get(name, {}).get("x-greedy", False)
                out += "(.+)" if greedy else "([^/]+)"
            else:
                out += re.escape(piece)
        return re.compile("^" + out + "$")

    def match(self, method, path):
        """Returns (template, operation or None); (None, None) when no path matches."""
        path = path.split("?", 1)[0]
        for template, item, rx in self._paths:
            if rx.match(path):
                return template, item.get(method.lower())
        return None, None

    def operations(self):
        for template, item in self.doc.get("paths", {}).items():
            for m in HTTP_METHODS:
                if m in item:
                    yield template, m, item[m]

    # ---- checking ---------------------------------------------------------------------
    def check(self, method, path, resp):
        """Checks one response (status, lower-cased headers dict, body bytes)."""
        template, op = self.match(method, path)
        if template is None:
            return self._check_response("x-unmatched-path", "x-unmatched-path",
                                        self.doc["x-unmatched-path"], resp)
        if op is None:
            return self._check_response("x-unmatched-method", "x-unmatched-method",
                                        self.doc["x-unmatched-method"], resp)
        op_id = op.get("operationId", f"{method} {template}")
        if "x-idemgate-job-id" in resp.headers and "x-passthrough" in op:
            return self._check_response(op_id, "x-passthrough", op["x-passthrough"], resp)
        responses = op.get("responses", {})
        code = str(resp.status)
        for key in (code, code[0] + "XX", "default"):
            if key in responses:
                return self._check_response(op_id, key, responses[key], resp)
        return Checked(op_id, None, None,
                       [f"status {code} is not documented for {method.upper()} {template} "
                        f"(documented: {sorted(responses)})"])

    def _check_response(self, op_id, key, response, resp):
        response = self.resolve(response)
        errors = []
        for name, h in (response.get("headers") or {}).items():
            h = self.resolve(h)
            value = resp.headers.get(name.lower())
            if value is None:
                if h.get("required"):
                    errors.append(f"required header {name} missing")
                continue
            if "schema" in h:
                errors += [f"header {name}: {e}" for e in
                           self.validate(h["schema"], value, name)]
        ctype = (resp.headers.get("content-type") or "").split(";")[0].strip().lower()
        content = response.get("content") or {}
        problem_type = None
        if not content:
            if resp.body:
                errors.append("a body where none is documented")
            return Checked(op_id, key, None, errors)
        media = content.get(ctype)
        if media is None:
            media = content.get(ctype.split("/")[0] + "/*") or content.get("*/*")
        if media is None:
            errors.append(f"content type {ctype!r} not documented (documented: {sorted(content)})")
            return Checked(op_id, key, None, errors)
        schema = media.get("schema", {})
        if ctype.endswith("json"):
            try:
                import json
                value = json.loads(resp.body)
            except ValueError as e:
                errors.append(f"body is not JSON: {e}")
                return Checked(op_id, key, None, errors)
            errors += self.validate(schema, value, "body")
            if ctype == "application/problem+json" and isinstance(value, dict):
                problem_type = value.get("type")
                if value.get("status") != resp.status:
                    errors.append(f"problem status {value.get('status')} != HTTP {resp.status}")
                if value.get("request_id") != resp.headers.get("x-request-id"):
                    errors.append("problem request_id differs from X-Request-Id")
        elif schema not in ({}, None):
            errors.append(f"{ctype} body cannot be validated against a schema")
        return Checked(op_id, key, problem_type, errors)

    # ---- JSON Schema subset -----------------------------------------------------------
    def declared_properties(self, schema):
        """The property names an object schema declares, its allOf parts included, or None when
        it is open (additionalProperties given somewhere, or no property listed at all)."""
        schema = self.resolve(schema)
        if not isinstance(schema, dict) or "additionalProperties" in schema:
            return None
        names = set(schema.get("properties", {}))
        listed = "properties" in schema
        for part in schema.get("allOf", []):
            sub = self.declared_properties(part)
            if sub is None:
                if "additionalProperties" in self.resolve(part):
                    return None
                continue
            names |= sub
            listed = True
        return names if listed else None

    def validate(self, schema, value, where="$", strict=True):
        schema = self.resolve(schema)
        if schema is True or schema == {} or schema is None:
            return []
        errs = []
        t = schema.get("type")
        if t is not None:
            types = t if isinstance(t, list) else [t]
            if not any(_is_type(value, ty) for ty in types):
                return [f"{where}: expected {t}, got {type(value).__name__} {_short(value)}"]
        if "const" in schema and value != schema["const"]:
            errs.append(f"{where}: expected {schema['const']!r}, got {_short(value)}")
        if "enum" in schema and value not in schema["enum"]:
            errs.append(f"{where}: {_short(value)} not in {schema['enum']}")
        if isinstance(value, str):
            if "minLength" in schema and len(value) < schema["minLength"]:
                errs.append(f"{where}: shorter than {schema['minLength']}")
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                errs.append(f"{where}: longer than {schema['maxLength']}")
            if "pattern" in schema and not re.search(schema["pattern"], value):
                errs.append(f"{where}: {_short(value)} does not match {schema['pattern']}")
            if schema.get("format") == "date-time" and not _is_datetime(value):
                errs.append(f"{where}: {_short(value)} is not an RFC 3339 date-time")
        if _is_type(value, "number"):
            if "minimum" in schema and value < schema["minimum"]:
                errs.append(f"{where}: {value} < {schema['minimum']}")
            if "maximum" in schema and value > schema["maximum"]:
                errs.append(f"{where}: {value} > {schema['maximum']}")
        if isinstance(value, dict):
            for name in schema.get("required", []):
                if name not in value:
                    errs.append(f"{where}: required property {name!r} missing")
            props = schema.get("properties", {})
            for name, sub in props.items():
                if name in value:
                    errs += self.validate(sub, value[name], f"{where}.{name}", strict)
            extra = schema.get("additionalProperties")
            if isinstance(extra, dict):
                for name in value:
                    if name not in props:
                        errs += self.validate(extra, value[name], f"{where}.{name}", strict)
            declared = set(props) if extra is False else (
                self.declared_properties(schema) if strict and extra is None else None)
            if declared is not None:
                for name in value:
                    if name not in declared:
                        errs.append(f"{where}: undocumented property {name!r}")
        if isinstance(value, list) and "items" in schema:
            for i, item in enumerate(value):
                errs += self.validate(schema["items"], item, f"{where}[{i}]", strict)
        for part in schema.get("allOf", []):
            # The parts are checked without the strictness rule: the union of their
            # properties was checked above.
            errs += self.validate(part, value, where, strict=False)
        if "anyOf" in schema:
            if not any(not self.validate(s, value, where, strict) for s in schema["anyOf"]):
                errs.append(f"{where}: matches no anyOf alternative")
        if "oneOf" in schema:
            n = sum(1 for s in schema["oneOf"] if not self.validate(s, value, where, strict))
            if n != 1:
                errs.append(f"{where}: matches {n} oneOf alternatives, not exactly one")
        return errs

    # ---- inventory --------------------------------------------------------------------
    def problem_types(self):
        """Every problem type URN the spec mentions."""
        found = set()

        def walk(node):
            if isinstance(node, dict):
                for v in node.values():
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)
            elif isinstance(node, str) and node.startswith(PROBLEM_PREFIX):
                found.add(node)
        walk(self.doc.get("paths", {}))
        walk(self.doc.get("components", {}))
        return found

    def documented_statuses(self):
        """{operationId: set of documented status keys}."""
        out = {}
        for template, method, op in self.operations():
            keys = set(op.get("responses", {}))
            if "x-passthrough" in op:
                keys.add("x-passthrough")
            out[op.get("operationId", f"{method} {template}")] = keys
        out["x-unmatched-path"] = {"x-unmatched-path"}
        out["x-unmatched-method"] = {"x-unmatched-method"}
        return out


def _is_type(value, ty):
    if ty == "null":
        return value is None
    if ty == "boolean":
        return isinstance(value, bool)
    if ty == "integer":
        return isinstance(value, int) and not isinstance(value, bool) or (
            isinstance(value, float) and value.is_integer())
    if ty == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if ty == "string":
        return isinstance(value, str)
    if ty == "array":
        return isinstance(value, list)
    if ty == "object":
        return isinstance(value, dict)
    raise ValueError(f"unknown type {ty}")


def _is_datetime(s):
    if not re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$", s):
        return False
    try:
        datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def _short(v):
    s = repr(v)
    return s if len(s) <= 80 else s[:77] + "..."


def source_problem_types(src_dir=os.path.join(ROOT, "src")):
    """Every problem type name the C sources pass to http_problem(r, status, TYPE, title, …):
    the lower-case string literals of each call that come before its (capitalised) title."""
    names = set()
    for fn in sorted(os.listdir(src_dir)):
        if not fn.endswith(".c"):
            continue
        with open(os.path.join(src_dir, fn)) as f:
            text = f.read()
        for m in re.finditer(r"\bhttp_problem\(\s*r\s*,", text):
            call = text[m.end():text.find(";", m.end())]
            for lit in re.findall(r'"((?:[^"\\]|\\.)*)"', call):
                if re.fullmatch(r"[a-z]+(?:-[a-z]+)*", lit):
                    names.add(lit)
                else:
                    break
    return {PROBLEM_PREFIX + n for n in names}
