"""docs/openapi.yaml against a live gateway: real requests provoke every status of every
operation, and every response is checked against the spec — the status is documented for the
operation, the required headers are present and valid, the body validates against the schema,
and a problem's `type` is one the spec lists for that response. The reverse holds too: every
problem type the spec documents is produced by some request here, and every problem type the C
sources can answer is documented. So the spec cannot drift either way.

The schema checks use a small validator written here for the subset of OpenAPI 3.1 / JSON
Schema 2020-12 the spec uses (python3-jsonschema is not a dependency): type (with "null" and
type lists), required, properties, additionalProperties, enum, const, items, $ref (to
#/components/...), allOf, oneOf, anyOf, minimum/maximum, minLength/maxLength, pattern and
format date-time. It is stricter than JSON Schema on purpose: an object whose schema lists its
properties may not carry undocumented ones unless the schema sets additionalProperties — a field
added to a response without being documented is drift.

How a response is matched (the spec's root description says the same):
  1. a 414 is checked against the root `x-uri-too-long` response, a 503 `shutting-down` against
     `x-shutting-down`, whatever the path; then the
     path and method select an operation; a path that matches none is checked against the
     root `x-unmatched-path` response, a known path with another method against
     `x-unmatched-method`;
  2. a response carrying X-Idemgate-Job-Id is the provider's stored answer (`Prefer: wait`),
     checked against the operation's `x-passthrough` response;
  3. otherwise the status selects the response: exact, then a 2XX-style range, then `default`.
"""

import datetime
import hashlib
import hmac
import json
import os
import re
import socket
import subprocess
import tempfile
import threading
import time
import types
import uuid

import pytest
import yaml

from conftest import GATEWAY_BIN, ROOT, Http, Response, free_port, provider, tenant_token

SPEC_PATH = os.path.join(ROOT, "docs", "openapi.yaml")
PROBLEM_PREFIX = "urn:idemgate:problem:"
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


# ---------------------------------------------------------------------------------------------
# The validator.
# ---------------------------------------------------------------------------------------------

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
        if resp.status == 414:
            return self._check_response("x-uri-too-long", "x-uri-too-long",
                                        self.doc["x-uri-too-long"], resp)
        if resp.status == 503 and b"problem:shutting-down" in resp.body:
            return self._check_response("x-shutting-down", "x-shutting-down",
                                        self.doc["x-shutting-down"], resp)
        # Refusals whatever the path (issue 21 items 8-10): documented at the root.
        for status, name in ((400, "bad-path"), (400, "bad-header"), (503, "server-full"),
                             (503, "bodies-full")):
            if resp.status == status and f"problem:{name}".encode() in resp.body:
                return self._check_response(f"x-{name}", f"x-{name}", self.doc[f"x-{name}"],
                                            resp)
        template, op = self.match(method, path)
        if template is None:
            return self._check_response("x-unmatched-path", "x-unmatched-path",
                                        self.doc["x-unmatched-path"], resp)
        if op is None:
            return self._check_response("x-unmatched-method", "x-unmatched-method",
                                        self.doc["x-unmatched-method"], resp)
        op_id = op.get("operationId", f"{method} {template}")
        # The job's headers on a provider's answer (a passthrough); on the gateway's own problem
        # (a job that ended without one: job-failed, job-canceled) they name the job only.
        own = resp.headers.get("content-type", "").startswith("application/problem+json")
        if "x-idemgate-job-id" in resp.headers and "x-passthrough" in op and not own:
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
        elif ctype.startswith("text/"):
            try:
                errors += self.validate(schema, resp.body.decode("utf-8"), "body")
            except UnicodeDecodeError:
                errors.append(f"{ctype} body is not UTF-8")
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
                return [f"{where}: wrong type: expected {t}, got {type(value).__name__} "
                        f"{_short(value)}"]
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
        for kw in ("anyOf", "oneOf"):
            if kw not in schema:
                continue
            results = [self.validate(s, value, where, strict) for s in schema[kw]]
            n = sum(1 for r in results if not r)
            if n == 0:
                # Say why the nearest alternative failed, not only that all did.
                errs.append(f"{where}: matches no {kw} alternative")
                errs += min(results, key=lambda r: ("wrong type" in r[0], len(r)))
            elif kw == "oneOf" and n > 1:
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
        out["x-uri-too-long"] = {"x-uri-too-long"}
        out["x-shutting-down"] = {"x-shutting-down"}
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
    """Every problem type name the C sources pass to reply_problem(r, status, TYPE, title, …)
    or reply_problem_with, reply_tenant_problem(r, token, status, TYPE, title, …) or the
    intake's raise_problem(in, status, TYPE, title, …): the lower-case string literals of each
    call that come before its (capitalised) title."""
    names = set()
    for fn in sorted(os.listdir(src_dir)):
        if not fn.endswith(".c"):
            continue
        with open(os.path.join(src_dir, fn)) as f:
            text = f.read()
        for m in re.finditer(r"\b(?:reply_problem(?:_with)?\(\s*r|raise_problem\(\s*in|"
                             r"reply_tenant_problem\(\s*r\s*,[^,]*)\s*,", text):
            call = text[m.end():text.find(";", m.end())]
            for lit in re.findall(r'"((?:[^"\\]|\\.)*)"', call):
                if re.fullmatch(r"[a-z]+(?:-[a-z]+)*", lit):
                    names.add(lit)
                else:
                    break
    return {PROBLEM_PREFIX + n for n in names}


# ---------------------------------------------------------------------------------------------
# The spec on its own, and the validator's teeth.
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def spec():
    return Spec()


def test_spec_is_openapi_3_1_and_every_reference_resolves(spec):
    doc = spec.doc
    assert doc["openapi"].startswith("3.1.")
    assert doc["info"]["title"] and doc["info"]["version"]
    refs = []

    def walk(node):
        if isinstance(node, dict):
            if "$ref" in node:
                refs.append(node["$ref"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(doc)
    assert refs
    for ref in refs:
        spec.resolve({"$ref": ref})
    ids = [op["operationId"] for _, _, op in spec.operations()]
    assert len(ids) == len(set(ids)), "operationIds are unique"
    for template, method, op in spec.operations():
        assert op.get("responses"), f"{method} {template}"
        for name in re.findall(r"\{(\w+)\}", template):
            params = [spec.resolve(p) for p in op.get("parameters", [])]
            assert any(p["in"] == "path" and p["name"] == name and p["required"]
                       for p in params), f"{method} {template}: path parameter {name}"
        for key, resp in op["responses"].items():
            assert re.fullmatch(r"[1-5](\d\d|XX)|default", key), key
            resp = spec.resolve(resp)
            assert "X-Request-Id" in resp.get("headers", {}), \
                f"{method} {template} {key}: every response carries X-Request-Id"
            for media, m in resp.get("content", {}).items():
                if media == "application/problem+json":
                    assert spec.declared_properties(m["schema"]) >= \
                        {"type", "title", "status", "detail", "request_id"}
    security = doc["components"]["securitySchemes"]
    for _, _, op in spec.operations():
        for req in op.get("security", doc["security"]):
            assert set(req) <= set(security)


def test_every_problem_type_the_source_can_answer_is_documented(spec):
    source = source_problem_types()
    assert len(source) >= 15, source   # the scan found the calls
    assert source - spec.problem_types() == set(), "answered by the gateway, not in the spec"
    assert spec.problem_types() - source == set(), "in the spec, answered nowhere"


def fake(status, headers, body):
    h = {"X-Request-Id": "req_1", **headers}
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    return Response(status, h, body.encode() if isinstance(body, str) else body)


def problem_body(status, name, **extra):
    return {"type": PROBLEM_PREFIX + name, "title": "t", "status": status, "detail": "d",
            "request_id": "req_1",
            "error": {"message": "t: d", "type": "invalid_request_error", "code": name}, **extra}


PJ = {"Content-Type": "application/problem+json"}
JOBS = "/v1/jobs/job_abc"


@pytest.mark.parametrize("method, path, resp, needle", [
    ("GET", JOBS, fake(418, PJ, problem_body(418, "internal")), "not documented"),
    ("GET", JOBS, fake(404, PJ, problem_body(404, "unknown-route")), "job-not-found', got"),
    ("GET", JOBS, fake(404, PJ, problem_body(404, "job-not-found", extra=1)), "undocumented"),
    ("GET", JOBS, fake(404, PJ, {"type": PROBLEM_PREFIX + "job-not-found"}), "required"),
    ("GET", JOBS, fake(404, PJ, {k: v for k, v in problem_body(404, "job-not-found").items()
                                 if k != "error"}), "'error' missing"),
    ("GET", JOBS, fake(404, PJ, problem_body(404, "job-not-found",
                                             error={"message": "m", "type": "t", "code": "c"})),
     "not in"),
    ("GET", JOBS, fake(404, PJ, problem_body(400, "job-not-found")), "problem status"),
    ("GET", JOBS, fake(404, {"Content-Type": "text/html"}, "<h1>no</h1>"), "content type"),
    ("GET", JOBS, fake(401, PJ, problem_body(401, "unauthorized")), "WWW-Authenticate"),
    ("GET", JOBS, fake(503, PJ, problem_body(503, "store-unavailable")), "Retry-After"),
    ("GET", JOBS, Response(200, {"Content-Type": "application/json"}, b'{"id":"job_x"}'),
     "X-Request-Id"),
    ("GET", JOBS, fake(200, {"Content-Type": "application/json"}, {"id": "job_x"}), "required"),
    ("GET", "/v1/jobs", fake(200, {"Content-Type": "application/json"},
                             {"object": "list", "data": [1]}), "expected object"),
    ("GET", "/healthz", fake(200, {"Content-Type": "application/json"}, {"status": "up"}),
     "expected 'ok'"),
    ("GET", "/readyz", fake(200, {"Content-Type": "application/json"},
                            {"ready": True, "database": True, "schema_version": "4",
                             "schema_expected": 4, "tripped_providers": []}),
     "expected integer"),
    ("POST", "/v1/providers/p/a/b", fake(200, {"Content-Type": "image/png",
                                                "X-Idemgate-Job-Id": "job_x"}, b"png"),
     "Location"),
    ("POST", "/v1/providers/p/a/b", fake(202, {"Content-Type": "application/json",
                                                "Location": "/elsewhere"}, {}), "does not match"),
    ("DELETE", JOBS, fake(404, PJ, problem_body(404, "not-found")), "method-not-allowed"),
    ("GET", "/nope", fake(404, PJ, problem_body(404, "job-not-found")), "not-found"),
])
def test_the_validator_rejects_what_the_spec_does_not_allow(spec, method, path, resp, needle):
    checked = spec.check(method, path, resp)
    assert checked.errors, checked
    assert any(needle in e for e in checked.errors), checked.errors


def test_the_validator_accepts_a_conforming_job(spec):
    job = {"id": "job_abc", "object": "job", "state": "completed", "terminal": True,
           "provider": "p", "route": "r", "idempotency_key": "k", "remote_id": None,
           "parent_id": None, "attempts": {"transport": 1, "generation": 1},
           "created_at": "2026-11-29T21:46:44.168673Z", "updated_at": "2026-11-29T21:46:44Z",
           "first_sent_at": None, "finished_at": None, "expires_at": "2026-12-06T21:46:44Z",
           "result": {"status": 200, "headers": {"content-type": "application/json"},
                      "body": {"anything": [1, {"x": None}]}},
           "usage": None, "cost": None, "provider_status": None, "profile": None,
           "polls": 0, "last_error": None, "links": {"self": "/v1/jobs/job_abc"}}
    ok = spec.check("GET", JOBS, fake(200, {"Content-Type": "application/json"}, job))
    assert ok.errors == [] and ok.status_key == "200" and ok.op_id == "getJob"
    job["result"]["extra"] = 1
    bad = spec.check("GET", JOBS, fake(200, {"Content-Type": "application/json"}, job))
    assert any("undocumented property 'extra'" in e for e in bad.errors), bad


# ---------------------------------------------------------------------------------------------
# The live conformance run.
# ---------------------------------------------------------------------------------------------

ADMIN_TOKEN = "admin-" + uuid.uuid4().hex
ADMIN_SHA = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()
HOOK_SECRET = "whsec-openapi-" + uuid.uuid4().hex
INTAKE = "/v1/providers/mock-images/images/generations"
# Documented but not provokable from outside: /metrics answers 500 only when it cannot
# allocate its text.
NOT_PROVOKED = {("metrics", "500")}


def raw_request(port, data, timeout=10):
    """Sends raw bytes (for what urllib refuses to send) and parses the one response."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        buf = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            buf += chunk
            head, sep, body = buf.partition(b"\r\n\r\n")
            m = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
            if sep and m and len(body) >= int(m.group(1)):
                break
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip()] = v.strip()
    return Response(status, headers, body)


class Lock:
    """ACCESS EXCLUSIVE locks held by a psql session of the test, until released."""

    def __init__(self, database_url, tables):
        self.proc = subprocess.Popen(["psql", database_url, "-X", "-q", "-v", "ON_ERROR_STOP=1"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.proc.stdin.write(f"BEGIN;\nLOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE "
                              "MODE;\n\\echo locked\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "locked"

    def release(self):
        if self.proc.poll() is None:
            self.proc.stdin.write("ROLLBACK;\n\\q\n")
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Conformance:
    """Sends requests, checks each answer against the spec and what the scenario meant to
    provoke, and remembers what was covered."""

    def __init__(self, spec):
        self.spec = spec
        self.failures = []
        self.covered = set()       # (operationId, status key)
        self.problem_types = set()

    def expect(self, label, method, path, resp, status, problem=None, passthrough=False):
        c = self.spec.check(method, path, resp)
        where = f"{label}: {method} {path} -> {resp.status}"
        for e in c.errors:
            self.failures.append(f"{where}: {e}")
        if resp.status != status:
            self.failures.append(f"{where}: expected {status} ({problem}), got {resp!r}")
        got = (c.problem_type or "").replace(PROBLEM_PREFIX, "") or None
        if got != problem:
            self.failures.append(f"{where}: expected problem {problem}, got {got}")
        if passthrough != (c.status_key == "x-passthrough"):
            self.failures.append(f"{where}: matched {c.status_key}, passthrough={passthrough}")
        if not c.errors and resp.status == status and got == problem:
            self.covered.add((c.op_id, c.status_key))
            if c.problem_type:
                self.problem_types.add(c.problem_type)
        return resp


def auth(token, **more):
    return {"Authorization": f"Bearer {token}", **more}


def test_every_operation_status_and_problem_type_conforms(spec, gateway_factory, database_url,
                                                         mock, token, psql, tmp_path):
    nowhere = f"http://127.0.0.1:{free_port()}"   # nothing listens: jobs never finish
    providers = [
        provider("mock-images", mock.url, auth={"header": "Authorization", "prefix": "Bearer ",
                                                "secret_env": "MOCK_IMAGES_API_KEY"},
                 pricing={"currency": "USD", "per_output": 1000},
                 archive={"hosts": ["127.0.0.1"], "allow_http": True, "allow_private": True}),
        provider("nowhere", nowhere, retry={"max_attempts": 1000, "deadline_seconds": 3600,
                                            "base_ms": 200, "cap_ms": 1000}),
        provider("reffed", mock.url, client_ref={"body_field": "metadata.client_ref"},
                 reconcile={"strategy": "get_by_client_id",
                            "lookup": {"path": "/v1/images/by-ref/{client_ref}", "id": "$.id",
                                       "client_ref": "$.client_ref",
                                       "absent": {"path": "$.error.code",
                                                  "equals": "not_found"}}}),
        provider("uploads", mock.url, path="/v1/images/edits", route="images/edits",
                 routes=[{"route": "images/edits", "method": "POST", "path": "/v1/images/edits",
                          "multipart": True}]),
        provider("unpriced", mock.url, pricing={
            "currency": "USD", "variants": {"keys": ["$.model"],
                                            "tables": {"listed": {"per_output": 1000}}}}),
        provider("hooked", mock.url, webhook={"verify": "hmac_sha256_hex",
                                              "secret_env": "HOOK_SECRET",
                                              "signature_header": "X-Signature",
                                              "task_id": "$.id"}),
    ]
    # An async provider whose profile has no cancel endpoint (fal-queue's), polled fast.
    falq_poll = json.load(open(os.path.join(ROOT, "deploy", "providers", "fal-queue.json")))["poll"]
    falq_poll.update(interval_ms=50, max_interval_ms=200)
    providers.append({"name": "falq", "base_url": mock.url + "/fal", "poll": falq_poll,
                      "profile": os.path.join(ROOT, "deploy", "providers", "fal-queue.json"),
                      "timeouts": {"connect_ms": 1000, "total_ms": 5000}})
    env = {"HOOK_SECRET": HOOK_SECRET, "FAL_KEY": "fal-openapi"}
    gw = gateway_factory(admin_token_sha256=ADMIN_SHA, providers=providers, env=env)
    sockdir = tempfile.mkdtemp(prefix="ig-nodb-")
    down = gateway_factory(admin_token_sha256=ADMIN_SHA, providers=providers, env=dict(
        env, DATABASE_URL=f"postgresql:///idemgate?host={sockdir}&port=1"))
    # One server thread and no workers: its only database connection is warmed up (statements
    # prepared) before the tables are locked, so each request fails fast on lock_timeout.
    quiet = dict(http_threads=1, db_workers=1, dispatch_workers=0, reconcile_workers=0,
                 poll_workers=0, archive_workers=0, reaper_interval_ms=0)
    locked = gateway_factory(admin_token_sha256=ADMIN_SHA, providers=providers, **quiet,
                             env=dict(env, DATABASE_URL=database_url +
                                      "&options=-c%20lock_timeout%3D100"))
    other = tenant_token(database_url)
    t = Conformance(spec)
    H = auth(token)
    A = auth(ADMIN_TOKEN)
    created = []

    def call(g, method, path, body=None, headers=None):
        return g.http.request(method, path, body, headers or {})

    def submit(g, key, body, **headers):
        h = auth(token, **{"Idempotency-Key": key, "Content-Type": "application/json"})
        h.update(headers)
        r = call(g, "POST", INTAKE if "route" not in headers else headers.pop("route"),
                 json.dumps(body) if not isinstance(body, str) else body, h)
        return r

    nowhere_keys = {}

    def retire(job_id):
        """Moves a job to its key's tombstone, as the janitor does (migration 0032)."""
        psql("INSERT INTO key_tombstones (tenant_id, idempotency_key, fingerprint, "
             "fingerprint_version, provider, route, job_id, state, written_at, expires_at) "
             "SELECT tenant_id, idempotency_key, fingerprint, fingerprint_version, provider, "
             "route, id, state, now(), now() + interval '30 days' FROM operations "
             f"WHERE id = '{job_id}'; DELETE FROM attempts WHERE operation_id = '{job_id}'; "
             f"DELETE FROM archive_outputs WHERE op_id = '{job_id}'; "
             f"DELETE FROM operations WHERE id = '{job_id}'")

    def nowhere_job():
        k = "nw-" + uuid.uuid4().hex
        r = call(gw, "POST", "/v1/providers/nowhere/images/generations", '{"prompt":"x"}',
                 auth(token, **{"Idempotency-Key": k}))
        assert r.status == 202, r
        created.append(r.json()["id"])
        nowhere_keys[r.json()["id"]] = k
        return r.json()["id"]

    def wait_again(job_id):
        """The job's own request again, with Prefer: wait."""
        return call(gw, "POST", "/v1/providers/nowhere/images/generations", '{"prompt":"x"}',
                    auth(token, **{"Idempotency-Key": nowhere_keys[job_id],
                                   "Prefer": "wait=1"}))

    def set_state(job_id, state, extra=""):
        psql(f"UPDATE operations SET state = '{state}', lease_owner = NULL, "
             f"lease_expires_at = NULL, lease_version = lease_version + 1 {extra} "
             f"WHERE id = '{job_id}'")

    def signed(body):
        sig = hmac.new(HOOK_SECRET.encode(), body.encode(), hashlib.sha256).hexdigest()
        return {"X-Signature": f"sha256={sig}", "Content-Type": "application/json"}

    try:
        # ---- submit -----------------------------------------------------------------------
        k = "oa-" + uuid.uuid4().hex
        r = t.expect("new", "POST", INTAKE, submit(gw, k, {"prompt": "p", "n": 1}), 202)
        t.expect("replay", "POST", INTAKE, submit(gw, k, {"n": 1, "prompt": "p"}), 202)
        assert r.headers["location"] == f"/v1/jobs/{r.json()['id']}"
        done = gw.wait_state(token, r.json()["id"], {"completed"})
        assert done["state"] == "completed", done
        completed_id = done["id"]
        t.expect("wait, completed", "POST", INTAKE,
                 submit(gw, "oa-" + uuid.uuid4().hex, {"prompt": "w"}, Prefer="wait=10"),
                 200, passthrough=True)
        mock.script([{"status": 400}])
        t.expect("wait, provider refused", "POST", INTAKE,
                 submit(gw, "oa-" + uuid.uuid4().hex, {"prompt": "f"}, Prefer="wait=10"),
                 400, passthrough=True)
        t.expect("no key", "POST", INTAKE, call(gw, "POST", INTAKE, "{}", H), 400,
                 "missing-idempotency-key")
        t.expect("long key", "POST", INTAKE, submit(gw, "k" * 256, {}), 400,
                 "invalid-idempotency-key")
        t.expect("bad json", "POST", INTAKE, submit(gw, "oa-j", '{"a":1,"a":2}'), 400,
                 "invalid-json")
        two_keys = (f"POST {INTAKE} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                    "Idempotency-Key: a\r\nIdempotency-Key: b\r\nContent-Length: 2\r\n"
                    "Connection: close\r\n\r\n{}").encode()
        t.expect("two keys", "POST", INTAKE, raw_request(gw.port, two_keys), 400,
                 "invalid-idempotency-key")
        t.expect("no token", "POST", INTAKE, call(gw, "POST", INTAKE, "{}",
                                                  {"Idempotency-Key": "x"}), 401, "unauthorized")
        t.expect("unknown route", "POST", "/v1/providers/mock-images/edits",
                 call(gw, "POST", "/v1/providers/mock-images/edits", "{}",
                      auth(token, **{"Idempotency-Key": "x"})), 404, "unknown-route")
        t.expect("too large", "POST", INTAKE,
                 submit(gw, "oa-big", json.dumps({"prompt": "x" * (1024 * 1024)})), 413,
                 "payload-too-large")
        t.expect("multipart", "POST", INTAKE,
                 call(gw, "POST", INTAKE, "--b\r\nContent-Disposition: form-data; name=\"p\""
                      "\r\n\r\nx\r\n--b--\r\n",
                      auth(token, **{"Idempotency-Key": "oa-mp",
                                     "Content-Type": "multipart/form-data; boundary=b"})),
                 415, "unsupported-media-type")
        uploads = "/v1/providers/uploads/images/edits"
        t.expect("multipart without its closing delimiter", "POST", uploads,
                 call(gw, "POST", uploads, "--b\r\nContent-Disposition: form-data; name=\"p\""
                      "\r\n\r\nx\r\n",
                      auth(token, **{"Idempotency-Key": "oa-mp2",
                                     "Content-Type": "multipart/form-data; boundary=b"})),
                 400, "invalid-multipart")
        t.expect("key reused", "POST", INTAKE, submit(gw, k, {"prompt": "other"}), 422,
                 "idempotency-key-reused")
        # A key whose job retention deleted: its tombstone answers (moved there as the janitor
        # does, migration 0032).
        gk, gbody = "oa-gone-" + uuid.uuid4().hex, {"prompt": "gone"}
        # (Never read through the gateway, whose cache would answer the key from memory.)
        gone = submit(gw, gk, gbody).json()["id"]
        deadline = time.monotonic() + 20
        while psql(f"SELECT state FROM operations WHERE id = '{gone}'") != [["completed"]]:
            assert time.monotonic() < deadline, "the job to delete never completed"
            time.sleep(0.05)
        retire(gone)
        t.expect("key expired", "POST", INTAKE, submit(gw, gk, gbody), 410,
                 "idempotency-key-expired")
        reffed = "/v1/providers/reffed/images/generations"
        t.expect("client reference unplaceable", "POST", reffed,
                 submit(gw, "oa-" + uuid.uuid4().hex, {"prompt": "p", "metadata": None},
                        route=reffed), 422, "client-ref-unplaceable")

        # Budgets (`idemgate tenant budget`), on a tenant of their own: a day's amount the
        # estimate passes, then no job in flight allowed; at intake and at regeneration.
        bname = "oa-budget-" + uuid.uuid4().hex[:8]
        btoken = tenant_token(database_url, bname)

        def budget(*args):
            subprocess.run([GATEWAY_BIN, "tenant", "budget", bname, *args], check=True,
                           capture_output=True, env=dict(os.environ, DATABASE_URL=database_url))

        def bcall(path, key):
            return call(gw, "POST", path, '{"prompt":"b"}',
                        auth(btoken, **{"Idempotency-Key": key, "Prefer": "wait=10"}))

        parent = bcall(INTAKE, "oa-b-" + uuid.uuid4().hex).headers["x-idemgate-job-id"]
        regen = f"/v1/jobs/{parent}/regenerate"
        budget("--day", "0")
        t.expect("over budget", "POST", INTAKE, bcall(INTAKE, "oa-b-" + uuid.uuid4().hex), 402,
                 "budget-exceeded")
        t.expect("regenerate, over budget", "POST", regen,
                 bcall(regen, "oa-b-" + uuid.uuid4().hex), 402, "budget-exceeded")
        budget("--in-flight", "0")
        t.expect("too many in flight", "POST", INTAKE, bcall(INTAKE, "oa-b-" + uuid.uuid4().hex),
                 429, "too-many-in-flight")
        t.expect("regenerate, too many in flight", "POST", regen,
                 bcall(regen, "oa-b-" + uuid.uuid4().hex), 429, "too-many-in-flight")
        budget("--clear")
        # A model the price table does not list, under an amount budget (issue 21 §7): at intake,
        # and at the regeneration of such a job made before the budget.
        unp = "/v1/providers/unpriced/images/generations"
        uparent = call(gw, "POST", unp, '{"prompt":"u","model":"unlisted"}',
                       auth(btoken, **{"Idempotency-Key": "oa-u-" + uuid.uuid4().hex,
                                       "Prefer": "wait=10"})).headers["x-idemgate-job-id"]
        budget("--day", "100")
        t.expect("unpriced under a budget", "POST", unp,
                 call(gw, "POST", unp, '{"prompt":"u","model":"unlisted"}',
                      auth(btoken, **{"Idempotency-Key": "oa-u-" + uuid.uuid4().hex})),
                 402, "unpriced-under-budget")
        t.expect("regenerate, unpriced under a budget", "POST", f"/v1/jobs/{uparent}/regenerate",
                 bcall(f"/v1/jobs/{uparent}/regenerate", "oa-u-" + uuid.uuid4().hex), 402,
                 "unpriced-under-budget")
        budget("--clear")

        # ---- usage ------------------------------------------------------------------------
        t.expect("usage", "GET", "/v1/usage", call(gw, "GET", "/v1/usage?group_by=day", None, H),
                 200)
        r = t.expect("usage, admin", "GET", "/v1/usage", call(gw, "GET", "/v1/usage", None, A),
                     200)
        assert any(row["tenant"] == bname for row in r.json()["data"]), r
        t.expect("usage, bad query", "GET", "/v1/usage",
                 call(gw, "GET", "/v1/usage?from=yesterday", None, H), 400, "invalid-query")
        t.expect("usage, no token", "GET", "/v1/usage", call(gw, "GET", "/v1/usage"), 401,
                 "unauthorized")

        # A job that ends without a provider body (an operator found it): Prefer: wait
        # answers the job itself, 200.
        found_key = "oa-found-" + uuid.uuid4().hex
        r = submit(gw, found_key, {"prompt": "f"}, route="/v1/providers/nowhere/images/generations")
        assert r.status == 202, r
        set_state(r.json()["id"], "review")
        resolve_path = f"/v1/jobs/{r.json()['id']}/resolve"
        t.expect("found, not proven", "POST", resolve_path,
                 call(gw, "POST", resolve_path,
                      '{"outcome":"found","remote_id":"task_seen_in_dashboard"}', H),
                 403, "adoption-not-proven")
        res = call(gw, "POST", resolve_path,
                   '{"outcome":"found","remote_id":"task_seen_in_dashboard"}', A)
        assert res.status == 200 and res.json()["state"] == "completed", res
        t.expect("wait, completed without a body", "POST",
                 "/v1/providers/nowhere/images/generations",
                 submit(gw, found_key, {"prompt": "f"}, Prefer="wait=1",
                        route="/v1/providers/nowhere/images/generations"), 200)

        # rate-limited: a tenant of one request per second, no burst, known at the start of a
        # gateway of its own; its second request in a row is refused.
        rl_name = "openapi-rl-" + uuid.uuid4().hex[:8]
        rl_token = tenant_token(database_url, rl_name)
        subprocess.check_call([GATEWAY_BIN, "tenant", "limits", rl_name, "--rps", "1",
                               "--burst", "1"], env=dict(os.environ, DATABASE_URL=database_url))
        limited = gateway_factory(providers=providers, env=env)
        # (to the provider nobody answers: its create never answered 2xx, so an `absent` on it
        # is not refused as a task known, and meets the tenant's rate below)
        rl_intake = "/v1/providers/nowhere/images/generations"
        rl = [call(limited, "POST", rl_intake, '{"prompt":"r"}',
                   auth(rl_token, **{"Idempotency-Key": "openapi-rl-" + uuid.uuid4().hex,
                                     "Content-Type": "application/json"})) for _ in range(2)]
        t.expect("rate limit: first", "POST", INTAKE, rl[0], 202)
        t.expect("rate limit: second at once", "POST", INTAKE, rl[1], 429, "rate-limited")
        # The same tenant gate holds an operator's `absent` (a resend) and a regeneration: each
        # is tried until one comes within the second of another (bounded).
        rl_job = rl[0].json()["id"]
        created.append(rl_job)
        rl_auth = auth(rl_token, **{"Content-Type": "application/json"})
        for _ in range(60):
            set_state(rl_job, "review")
            r = call(limited, "POST", f"/v1/jobs/{rl_job}/resolve", '{"outcome":"absent"}',
                     rl_auth)
            if r.status == 429:
                break
        t.expect("resolve absent, rate limit", "POST", f"/v1/jobs/{rl_job}/resolve", r, 429,
                 "rate-limited")
        set_state(rl_job, "completed", ", finished_at = now()")
        for _ in range(60):
            r = call(limited, "POST", f"/v1/jobs/{rl_job}/regenerate", "",
                     auth(rl_token, **{"Idempotency-Key": "openapi-rl-" + uuid.uuid4().hex}))
            if r.status == 202:
                created.append(r.json()["id"])
            if r.status == 429:
                break
        t.expect("regenerate, rate limit", "POST", f"/v1/jobs/{rl_job}/regenerate", r, 429,
                 "rate-limited")

        # store-busy: every try of the intake hits a serialization failure.
        fn = "openapi_busy_" + uuid.uuid4().hex[:8]
        psql(f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
             f"RAISE EXCEPTION 'injected by test_openapi' USING ERRCODE = 'serialization_failure';"
             f" END $$")
        psql(f"CREATE TRIGGER {fn} BEFORE INSERT ON operations FOR EACH ROW "
             f"WHEN (NEW.idempotency_key LIKE 'openapi-busy-%') EXECUTE FUNCTION {fn}()")
        try:
            t.expect("serialization failures", "POST", INTAKE,
                     submit(gw, "openapi-busy-" + uuid.uuid4().hex, {"prompt": "b"}), 503,
                     "store-busy")
        finally:
            psql(f"DROP TRIGGER {fn} ON operations")
            psql(f"DROP FUNCTION {fn}()")

        # ---- jobs -------------------------------------------------------------------------
        t.expect("list", "GET", "/v1/jobs", call(gw, "GET", "/v1/jobs?state=completed&limit=5",
                                                 None, H), 200)
        t.expect("list, bad state", "GET", "/v1/jobs",
                 call(gw, "GET", "/v1/jobs?state=bogus", None, H), 400, "invalid-query")
        t.expect("list, no token", "GET", "/v1/jobs", call(gw, "GET", "/v1/jobs"), 401,
                 "unauthorized")
        t.expect("get", "GET", f"/v1/jobs/{completed_id}",
                 call(gw, "GET", f"/v1/jobs/{completed_id}", None, H), 200)
        t.expect("get, other tenant", "GET", f"/v1/jobs/{completed_id}",
                 call(gw, "GET", f"/v1/jobs/{completed_id}", None, auth(other)), 404,
                 "job-not-found")
        t.expect("get, no token", "GET", "/v1/jobs/job_x", call(gw, "GET", "/v1/jobs/job_x"),
                 401, "unauthorized")

        # ---- archived outputs -------------------------------------------------------------
        out0 = f"/v1/jobs/{completed_id}/outputs/0"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            arch = gw.job(token, completed_id).json().get("archive") or []
            if arch and arch[0]["state"] == "archived":
                break
            time.sleep(0.1)
        whole = t.expect("output", "GET", out0, call(gw, "GET", out0, None, H), 200)
        etag = whole.headers["etag"]
        t.expect("output, range", "GET", out0, call(gw, "GET", out0, None,
                                                     auth(token, Range="bytes=0-2")), 206)
        t.expect("output, not modified", "GET", out0,
                 call(gw, "GET", out0, None, auth(token, **{"If-None-Match": etag})), 304)
        t.expect("output, range past the end", "GET", out0,
                 call(gw, "GET", out0, None, auth(token, Range="bytes=99999999-")), 416,
                 "range-not-satisfiable")
        t.expect("output, other tenant", "GET", out0, call(gw, "GET", out0, None, auth(other)),
                 404, "job-not-found")
        t.expect("output, no such index", "GET", out0,
                 call(gw, "GET", f"/v1/jobs/{completed_id}/outputs/99", None, H), 404,
                 "output-not-found")
        pending = f"/v1/jobs/{nowhere_job()}/outputs/0"
        t.expect("output, not archived", "GET", pending, call(gw, "GET", pending, None, H), 404,
                 "output-not-archived")
        t.expect("output, no token", "GET", out0, call(gw, "GET", out0), 401, "unauthorized")
        # The same output as seen by a replica that cannot reach its bytes: stored by another
        # replica in a store this one lacks, stored in the other kind of store, and a store that
        # cannot be read (a symbolic link loop where the object would be: ELOOP, even as root).
        row = f"op_id = '{completed_id}' AND n = 0"
        (saved,) = psql(f"SELECT sha256, backend, coalesce(stored_by, '') FROM archive_outputs "
                        f"WHERE {row}")
        absent = "f" * 64
        psql(f"UPDATE archive_outputs SET sha256 = '{absent}', stored_by = 'replica-elsewhere' "
             f"WHERE {row}")
        t.expect("output, in another replica's store", "GET", out0,
                 call(gw, "GET", out0, None, H), 503, "output-in-other-replica")
        psql(f"UPDATE archive_outputs SET backend = 's3' WHERE {row}")
        t.expect("output, in another kind of store", "GET", out0,
                 call(gw, "GET", out0, None, H), 503, "output-in-other-store")
        psql(f"UPDATE archive_outputs SET backend = 'local' WHERE {row}")
        loop = tmp_path / "archive" / "objects" / absent[:2] / absent
        loop.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(loop, loop)
        t.expect("output, store unreadable", "GET", out0, call(gw, "GET", out0, None, H), 503,
                 "archive-unavailable")
        loop.unlink()
        # A replica archiving to a bucket, one of whose reads is in progress (held by a pause
        # point before the bucket is asked; nothing listens there): another is told to come back.
        psql(f"UPDATE archive_outputs SET backend = 's3' WHERE {row}")
        bucket = gateway_factory(providers=providers, **dict(quiet, db_workers=2),
                                 archive_backend="s3", archive_s3_endpoint=nowhere,
                                 archive_s3_bucket="archive", archive_s3_reads_max=1,
                                 archive_dir=str(tmp_path / "bucket-spool"),
                                 env=dict(env, AWS_ACCESS_KEY_ID="K", AWS_SECRET_ACCESS_KEY="S",
                                          IDEMGATE_PAUSE="archive_s3_read:5000"))
        held = threading.Thread(target=lambda: call(bucket, "GET", out0, None, H))
        held.start()
        deadline = time.monotonic() + 10
        while '"archive_s3_read"' not in bucket.log():
            assert time.monotonic() < deadline, bucket.log()[-2000:]
            time.sleep(0.02)
        t.expect("output, bucket reads at their bound", "GET", out0,
                 call(bucket, "GET", out0, None, H), 503, "archive-busy")
        held.join(20)
        # Its slot given back: the next read asks the bucket (nothing listens there).
        assert call(bucket, "GET", out0, None, H).json()["type"].endswith("archive-unavailable")
        psql(f"UPDATE archive_outputs SET sha256 = '{saved[0]}', backend = '{saved[1]}', "
             f"stored_by = nullif('{saved[2]}', '') WHERE {row}")
        assert call(gw, "GET", out0, None, H).status == 200

        seen = nowhere_job()
        set_state(seen, "review", ", remote_id = 'task_seen'")
        path = f"/v1/jobs/{seen}/resolve"
        t.expect("resolve absent, task known", "POST", path,
                 call(gw, "POST", path, '{"outcome":"absent"}', H), 409, "task-known")
        gone = nowhere_job()
        set_state(gone, "review", ", provider = 'removed-since'")
        path = f"/v1/jobs/{gone}/resolve"
        t.expect("resolve found, provider not configured", "POST", path,
                 call(gw, "POST", path, '{"outcome":"found","remote_id":"t"}', A), 409,
                 "provider-not-configured")
        review = nowhere_job()
        set_state(review, "review")
        path = f"/v1/jobs/{review}/resolve"
        t.expect("resolve, bad body", "POST", path, call(gw, "POST", path, '{"outcome":1}', H),
                 400, "invalid-resolution")
        t.expect("resolve, no token", "POST", path,
                 call(gw, "POST", path, '{"outcome":"abandon"}'), 401, "unauthorized")
        t.expect("resolve, no job", "POST", "/v1/jobs/job_none/resolve",
                 call(gw, "POST", "/v1/jobs/job_none/resolve", '{"outcome":"abandon"}', H),
                 404, "job-not-found")
        r = t.expect("resolve", "POST", path,
                     call(gw, "POST", path, '{"outcome":"abandon","operator":"oa"}', H), 200)
        assert r.json()["state"] == "failed" and "idempotent-replayed" not in r.headers
        r = t.expect("resolve again", "POST", path,
                     call(gw, "POST", path, '{"outcome":"abandon"}', H), 200)
        assert r.headers.get("idempotent-replayed") == "true"
        t.expect("resolve differently", "POST", path,
                 call(gw, "POST", path, '{"outcome":"absent"}', H), 409, "not-in-review")

        path = f"/v1/jobs/{completed_id}/regenerate"
        rk = "oa-regen-" + uuid.uuid4().hex
        r = t.expect("regenerate", "POST", path,
                     call(gw, "POST", path, "", auth(token, **{"Idempotency-Key": rk})), 202)
        created.append(r.json()["id"])
        r = t.expect("regenerate again", "POST", path,
                     call(gw, "POST", path, "", auth(token, **{"Idempotency-Key": rk})), 202)
        assert r.headers.get("idempotent-replayed") == "true"
        t.expect("regenerate, no key", "POST", path, call(gw, "POST", path, "", H), 400,
                 "missing-idempotency-key")
        t.expect("regenerate, bad key", "POST", path,
                 call(gw, "POST", path, "", auth(token, **{"Idempotency-Key": "k" * 300})), 400,
                 "invalid-idempotency-key")
        t.expect("regenerate, no token", "POST", path,
                 call(gw, "POST", path, "", {"Idempotency-Key": rk}), 401, "unauthorized")
        t.expect("regenerate, no parent", "POST", "/v1/jobs/job_none/regenerate",
                 call(gw, "POST", "/v1/jobs/job_none/regenerate", "",
                      auth(token, **{"Idempotency-Key": "oa-" + uuid.uuid4().hex})), 404,
                 "job-not-found")
        running = nowhere_job()
        t.expect("regenerate, parent running", "POST", f"/v1/jobs/{running}/regenerate",
                 call(gw, "POST", f"/v1/jobs/{running}/regenerate", "",
                      auth(token, **{"Idempotency-Key": "oa-" + uuid.uuid4().hex})), 409,
                 "parent-not-terminal")
        t.expect("regenerate, key of another parent", "POST", f"/v1/jobs/{review}/regenerate",
                 call(gw, "POST", f"/v1/jobs/{review}/regenerate", "",
                      auth(token, **{"Idempotency-Key": rk})), 422, "idempotency-key-reused")
        rk2 = "oa-regen-" + uuid.uuid4().hex
        child = call(gw, "POST", path, "", auth(token, **{"Idempotency-Key": rk2})).json()["id"]
        retire(child)
        t.expect("regenerate, key expired", "POST", path,
                 call(gw, "POST", path, "", auth(token, **{"Idempotency-Key": rk2})), 410,
                 "idempotency-key-expired")

        cancel_me = nowhere_job()
        set_state(cancel_me, "unknown")
        path = f"/v1/jobs/{cancel_me}/cancel"
        r = t.expect("cancel, not terminal", "POST", path, call(gw, "POST", path, "", H), 202)
        assert r.json()["cancel_requested_at"]
        r = call(gw, "POST", "/v1/providers/falq/flux-dev",
                 json.dumps({"prompt": "runs", "_mock": {"polls": 100000}}),
                 auth(token, **{"Idempotency-Key": "oa-nc-" + uuid.uuid4().hex}))
        assert r.status == 202, r
        running = gw.wait_state(token, r.json()["id"], {"accepted"}, 15)
        assert running["state"] == "accepted", running
        t.expect("cancel, provider cannot stop it", "POST", f"/v1/jobs/{running['id']}/cancel",
                 call(gw, "POST", f"/v1/jobs/{running['id']}/cancel", "", H), 409,
                 "cancel-unsupported")
        t.expect("cancel, terminal", "POST", f"/v1/jobs/{completed_id}/cancel",
                 call(gw, "POST", f"/v1/jobs/{completed_id}/cancel", "", H), 200)
        t.expect("cancel, no job", "POST", "/v1/jobs/job_none/cancel",
                 call(gw, "POST", "/v1/jobs/job_none/cancel", "", H), 404, "job-not-found")
        t.expect("cancel, no token", "POST", path, call(gw, "POST", path, ""), 401,
                 "unauthorized")
        # A task the provider ended on our cancel (issue 21 item 1): terminal, listed under its
        # own state, remote id kept, and a cancel of it answers it unchanged.
        ended = nowhere_job()
        set_state(ended, "canceled", ", remote_id = 'task_oa_canceled', finished_at = now(), "
                                     "cancel_requested_at = now()")
        r = t.expect("list, canceled", "GET", "/v1/jobs",
                     call(gw, "GET", "/v1/jobs?state=canceled&limit=1000", None, H), 200)
        listed = [j for j in r.json()["data"] if j["id"] == ended]
        assert [j["state"] for j in r.json()["data"]] == ["canceled"] * len(r.json()["data"])
        assert len(listed) == 1 and listed[0]["terminal"] is True, r.json()
        assert listed[0]["remote_id"] == "task_oa_canceled", listed
        r = t.expect("get, canceled", "GET", f"/v1/jobs/{ended}",
                     call(gw, "GET", f"/v1/jobs/{ended}", None, H), 200)
        assert r.json()["state"] == "canceled" and r.json()["terminal"] is True, r.json()
        r = t.expect("cancel, canceled", "POST", f"/v1/jobs/{ended}/cancel",
                     call(gw, "POST", f"/v1/jobs/{ended}/cancel", "", H), 200)
        assert r.json()["state"] == "canceled", r.json()
        # Prefer: wait on a job that ended without a provider answer: never a 200.
        r = t.expect("wait, canceled without an answer", "POST",
                     "/v1/providers/nowhere/images/generations", wait_again(ended), 409,
                     "job-canceled")
        assert r.headers["x-idemgate-job-id"] == ended, r.headers
        failed = nowhere_job()
        set_state(failed, "failed", ", finished_at = now(), last_error = 'refused every time'")
        r = t.expect("wait, failed without an answer", "POST",
                     "/v1/providers/nowhere/images/generations", wait_again(failed), 502,
                     "job-failed")
        assert "refused every time" in r.json()["detail"], r.json()

        # ---- operator ---------------------------------------------------------------------
        path = "/v1/admin/providers/mock-images/reset"
        r = t.expect("reset", "POST", path, call(gw, "POST", path, "", A), 200)
        assert r.json() == {"provider": "mock-images", "cleared": False}
        t.expect("reset, tenant token", "POST", path, call(gw, "POST", path, "", H), 401,
                 "unauthorized")
        t.expect("reset, unknown provider", "POST", "/v1/admin/providers/nope/reset",
                 call(gw, "POST", "/v1/admin/providers/nope/reset", "", A), 404,
                 "unknown-provider")
        accepted = nowhere_job()
        set_state(accepted, "accepted", ", remote_id = 'task_oa', "
                                        "poll_deadline_at = now() - interval '1 hour'")
        path = f"/v1/admin/jobs/{accepted}/resume"
        r = t.expect("resume", "POST", path, call(gw, "POST", path, "", A), 200)
        assert r.json() == {"resumed": True}
        t.expect("resume, tenant token", "POST", path, call(gw, "POST", path, "", H), 401,
                 "unauthorized")
        t.expect("resume, not accepted", "POST", f"/v1/admin/jobs/{completed_id}/resume",
                 call(gw, "POST", f"/v1/admin/jobs/{completed_id}/resume", "", A), 404,
                 "job-not-found")

        # The admin reads of the operator console.
        r = t.expect("admin jobs", "GET", "/v1/admin/jobs",
                     call(gw, "GET", "/v1/admin/jobs?state=failed&provider=nowhere&limit=5",
                          None, A), 200)
        assert r.json()["data"] and all(j["provider"] == "nowhere" for j in r.json()["data"])
        t.expect("admin jobs, bad limit", "GET", "/v1/admin/jobs",
                 call(gw, "GET", "/v1/admin/jobs?limit=0", None, A), 400, "invalid-query")
        t.expect("admin jobs, tenant token", "GET", "/v1/admin/jobs",
                 call(gw, "GET", "/v1/admin/jobs", None, H), 401, "unauthorized")
        path = f"/v1/admin/jobs/{completed_id}"
        r = t.expect("admin job", "GET", path, call(gw, "GET", path, None, A), 200)
        assert r.json()["attempts"][0]["outcome"] == "success", r
        t.expect("admin job, tenant token", "GET", path, call(gw, "GET", path, None, H), 401,
                 "unauthorized")
        t.expect("admin job, no job", "GET", "/v1/admin/jobs/job_none",
                 call(gw, "GET", "/v1/admin/jobs/job_none", None, A), 404, "job-not-found")
        r = t.expect("admin jobs, page", "GET", "/v1/admin/jobs",
                     call(gw, "GET", "/v1/admin/jobs?limit=1", None, A), 200)
        assert r.json()["has_more"] is True and r.json()["data"][0]["tenant"], r
        t.expect("overview", "GET", "/v1/admin/overview",
                 call(gw, "GET", "/v1/admin/overview", None, A), 200)
        t.expect("overview, a parameter", "GET", "/v1/admin/overview",
                 call(gw, "GET", "/v1/admin/overview?days=7", None, A), 400, "invalid-query")
        t.expect("overview, tenant token", "GET", "/v1/admin/overview",
                 call(gw, "GET", "/v1/admin/overview", None, H), 401, "unauthorized")
        aout = f"/v1/admin/jobs/{completed_id}/outputs/0"
        t.expect("admin output", "GET", aout, call(gw, "GET", aout, None, A), 200)
        t.expect("admin output, tenant token", "GET", aout, call(gw, "GET", aout, None, H), 401,
                 "unauthorized")
        for p404, kind in ((f"/v1/admin/jobs/{completed_id}/outputs/99", "output-not-found"),
                           (f"/v1/admin/jobs/{nowhere_job()}/outputs/0", "output-not-archived"),
                           ("/v1/admin/jobs/job_none/outputs/0", "job-not-found")):
            t.expect("admin output, 404", "GET", p404, call(gw, "GET", p404, None, A), 404, kind)
        r = t.expect("providers", "GET", "/v1/admin/providers",
                     call(gw, "GET", "/v1/admin/providers", None, A), 200)
        assert [p["name"] for p in r.json()["data"]] == [p["name"] for p in providers]
        t.expect("providers, no token", "GET", "/v1/admin/providers",
                 call(gw, "GET", "/v1/admin/providers"), 401, "unauthorized")

        # ---- the console's files ------------------------------------------------------------
        t.expect("console", "GET", "/console", call(gw, "GET", "/console"), 200)
        for name in ("app.js", "app.css", "favicon.svg"):
            t.expect("console file", "GET", f"/console/{name}",
                     call(gw, "GET", f"/console/{name}"), 200)
        t.expect("console, no such file", "GET", "/console/nope.js",
                 call(gw, "GET", "/console/nope.js"), 404, "not-found")

        # ---- webhooks ---------------------------------------------------------------------
        path = "/v1/webhooks/hooked"
        delivery = json.dumps({"id": "task_" + uuid.uuid4().hex, "status": "succeeded"})
        r = t.expect("webhook", "POST", path, call(gw, "POST", path, delivery, signed(delivery)),
                     200)
        assert r.json() == {"received": True, "duplicate": False, "parked": True}
        r = t.expect("webhook again", "POST", path,
                     call(gw, "POST", path, delivery, signed(delivery)), 200)
        assert r.json()["duplicate"] is True
        t.expect("webhook, bad signature", "POST", path,
                 call(gw, "POST", path, delivery, {"X-Signature": "sha256=" + "0" * 64}), 401,
                 "bad-signature")
        no_task = json.dumps({"status": "succeeded"})
        t.expect("webhook, no task id", "POST", path,
                 call(gw, "POST", path, no_task, signed(no_task)), 400, "invalid-webhook")
        t.expect("webhook, provider without webhooks", "POST", "/v1/webhooks/mock-images",
                 call(gw, "POST", "/v1/webhooks/mock-images", delivery, signed(delivery)), 404,
                 "unknown-provider")

        # ---- health, metrics, unmatched ---------------------------------------------------
        r = t.expect("health", "GET", "/healthz", call(gw, "GET", "/healthz"), 200)
        r = t.expect("ready", "GET", "/readyz", call(gw, "GET", "/readyz"), 200)
        r = t.expect("metrics", "GET", "/metrics", call(gw, "GET", "/metrics"), 200)
        assert b"idemgate_database_up 1" in r.body
        # Metrics on a listener of their own, behind a token: the API's listener answers 404,
        # the metrics listener 401 without the token.
        mport = free_port()
        metered = gateway_factory(admin_token_sha256=ADMIN_SHA, providers=providers, **quiet,
                                  env=env, metrics_listen=f"127.0.0.1:{mport}",
                                  metrics_token_sha256=hashlib.sha256(b"mt").hexdigest())
        t.expect("metrics, own listener elsewhere", "GET", "/metrics",
                 call(metered, "GET", "/metrics"), 404, "not-found")
        listener = types.SimpleNamespace(http=Http(f"http://127.0.0.1:{mport}"))
        t.expect("metrics, no metrics token", "GET", "/metrics",
                 call(listener, "GET", "/metrics"), 401, "unauthorized")
        t.expect("metrics, metrics token", "GET", "/metrics",
                 call(listener, "GET", "/metrics", None, auth("mt")), 200)
        t.expect("unknown path", "GET", "/nope", call(gw, "GET", "/nope"), 404, "not-found")
        t.expect("unknown job action", "POST", f"/v1/jobs/{completed_id}/bogus",
                 call(gw, "POST", f"/v1/jobs/{completed_id}/bogus", "", H), 404, "not-found")
        t.expect("wrong method", "GET", INTAKE, call(gw, "GET", INTAKE, None, H), 405,
                 "method-not-allowed")
        t.expect("wrong method", "DELETE", "/v1/jobs", call(gw, "DELETE", "/v1/jobs", None, H),
                 405, "method-not-allowed")
        # A method nobody serves on a probe's path (it answered 200 before): 405, Allow named.
        r = t.expect("unknown method on a probe", "FOO", "/healthz",
                     raw_request(gw.port, b"FOO /healthz HTTP/1.1\r\nHost: x\r\n\r\n"), 405,
                     "method-not-allowed")
        assert r.headers["allow"] == "GET, HEAD", r.headers
        assert call(gw, "HEAD", "/healthz").status == 200
        r = call(gw, "GET", "/healthz", None, {"X-Request-Id": "trace-42.a_b"})
        assert r.headers["x-request-id"] == "trace-42.a_b"

        # Ambiguous framing, on every operation's path.
        samples = {"submit": INTAKE, "listJobs": "/v1/jobs",
                   "getJob": f"/v1/jobs/{completed_id}",
                   "getJobOutput": f"/v1/jobs/{completed_id}/outputs/0",
                   "resolveJob": f"/v1/jobs/{completed_id}/resolve",
                   "regenerateJob": f"/v1/jobs/{completed_id}/regenerate",
                   "cancelJob": f"/v1/jobs/{completed_id}/cancel",
                   "resetProvider": "/v1/admin/providers/mock-images/reset",
                   "listAdminJobs": "/v1/admin/jobs", "getAdminJob": f"/v1/admin/jobs/{completed_id}",
                   "getAdminOverview": "/v1/admin/overview",
                   "getAdminJobOutput": f"/v1/admin/jobs/{completed_id}/outputs/0",
                   "listProviders": "/v1/admin/providers", "consolePage": "/console",
                   "consoleAsset": "/console/app.js",
                   "resumePolling": f"/v1/admin/jobs/{completed_id}/resume",
                   "receiveWebhook": "/v1/webhooks/hooked", "metrics": "/metrics",
                   "getUsage": "/v1/usage",
                   "health": "/healthz", "ready": "/readyz"}
        for template, method, op in spec.operations():
            p = samples[op["operationId"]]
            req = (f"{method.upper()} {p} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                   "Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}").encode()
            r = t.expect(f"framing ({op['operationId']})", method.upper(), p,
                         raw_request(gw.port, req), 400, "bad-request-framing")
            assert r.headers.get("connection", "").lower() == "close"

        # Paths routed as sent and header values read whole (issue 21 items 9 and 10), on any
        # path; the reserve kept for /healthz when every connection is taken (item 8).
        t.expect("dot segment", "GET", "/v1/jobs/%2e%2e",
                 call(gw, "GET", "/v1/jobs/%2e%2e", None, H), 400, "bad-path")
        req = (f"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Note: a\x00b\r\n"
               f"Authorization: Bearer {token}\r\n\r\n").encode()
        t.expect("NUL in a header", "GET", "/v1/jobs", raw_request(gw.port, req), 400,
                 "bad-header")
        full = gateway_factory(max_connections=16, providers=providers, env=dict(
            env, IDEMGATE_MAX_CONNECTIONS_PER_ADDRESS="4"))
        held = []
        try:
            for a in range(2, 6):
                for _ in range(4):
                    sock = socket.socket()
                    sock.settimeout(10)
                    sock.bind((f"127.0.0.{a}", 0))
                    sock.connect(("127.0.0.1", full.port))
                    held.append(sock)
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    assert sock.recv(65536).startswith(b"HTTP/1.1 200"), "not held"
            req = f"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n"
            t.expect("every connection taken", "GET", "/v1/jobs",
                     raw_request(full.port, req.encode()), 503, "server-full")
        finally:
            for sock in held:
                sock.close()

        # Bodies held in memory, all connections together, at max_buffered_body_bytes (by a
        # tenant's clients: those without a live token fill half of it at most).
        bodies = gateway_factory(providers=providers, env=dict(
            env, IDEMGATE_MAX_BODY_BYTES="65536", IDEMGATE_MAX_UPLOAD_BYTES="131072",
            IDEMGATE_MAX_BUFFERED_BODY_BYTES="1048576"))
        held = []
        try:
            for _ in range(16):
                sock = socket.socket()
                sock.settimeout(10)
                sock.connect(("127.0.0.1", bodies.port))
                held.append(sock)
                sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                             + token.encode() + b"\r\nContent-Length: 60000\r\n\r\n"
                             + b" " * 50000)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and "idemgate_http_body_bytes 1048576" not in \
                    bodies.http.request("GET", "/metrics").body.decode():
                time.sleep(0.05)
            req = (f"POST {INTAKE} HTTP/1.1\r\nHost: x\r\n"
                   f"Authorization: Bearer {token}\r\nIdempotency-Key: k\r\n"
                   "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
            t.expect("bodies in memory at their bound", "POST", INTAKE,
                     raw_request(bodies.port, req.encode()), 503, "bodies-full")
        finally:
            for sock in held:
                sock.close()

        # A target over what a connection can hold (issue 14 §5), on any path.
        many = "&".join(f"p{i}=v" for i in range(65))
        req = (f"GET /v1/jobs?{many} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}"
               "\r\n\r\n").encode()
        t.expect("too many query parameters", "GET", "/v1/jobs", raw_request(gw.port, req), 414,
                 "uri-too-long")

        # ---- the database unreachable: 503 with Retry-After -------------------------------
        for method, p, body, h in [
                ("POST", INTAKE, '{"prompt":"x"}', auth(token, **{"Idempotency-Key": "oa-d"})),
                ("GET", "/v1/jobs", None, H), ("GET", "/v1/jobs/job_x", None, H),
                ("GET", "/v1/jobs/job_x/outputs/0", None, H),
                ("POST", "/v1/jobs/job_x/resolve", '{"outcome":"abandon"}', H),
                ("POST", "/v1/jobs/job_x/regenerate", "", auth(token, **{"Idempotency-Key": "r"})),
                ("POST", "/v1/jobs/job_x/cancel", "", H),
                ("POST", "/v1/admin/providers/mock-images/reset", "", A),
                ("POST", "/v1/admin/jobs/job_x/resume", "", A),
                ("GET", "/v1/usage", None, H),
                ("GET", "/v1/admin/jobs", None, A), ("GET", "/v1/admin/jobs/job_x", None, A),
                ("GET", "/v1/admin/overview", None, A),
                ("GET", "/v1/admin/jobs/job_x/outputs/0", None, A),
                ("GET", "/v1/admin/providers", None, A),
                ("POST", "/v1/webhooks/hooked", delivery, signed(delivery))]:
            t.expect("database down", method, p, call(down, method, p, body, h), 503,
                     "store-unavailable")
        t.expect("ready, database down", "GET", "/readyz", call(down, "GET", "/readyz"), 503)
        r = t.expect("metrics, database down", "GET", "/metrics", call(down, "GET", "/metrics"),
                     200)
        assert b"idemgate_database_up 0" in r.body

        def database_calls():
            """One request of every operation that reads or writes the database."""
            return [
                ("POST", INTAKE, '{"prompt":"x"}',
                 auth(token, **{"Idempotency-Key": "oa-l-" + uuid.uuid4().hex})),
                ("GET", "/v1/jobs", None, H), ("GET", f"/v1/jobs/{completed_id}", None, H),
                ("GET", f"/v1/jobs/{completed_id}/outputs/0", None, H),
                ("POST", f"/v1/jobs/{completed_id}/resolve", '{"outcome":"abandon"}', H),
                ("POST", f"/v1/jobs/{completed_id}/regenerate", "",
                 auth(token, **{"Idempotency-Key": "oa-l-" + uuid.uuid4().hex})),
                ("POST", f"/v1/jobs/{completed_id}/cancel", "", H),
                ("POST", "/v1/admin/providers/mock-images/reset", "", A),
                ("POST", f"/v1/admin/jobs/{completed_id}/resume", "", A),
                ("GET", "/v1/usage", None, H),
                ("GET", "/v1/admin/jobs", None, A), ("GET", f"/v1/admin/jobs/{completed_id}",
                                                     None, A),
                ("GET", "/v1/admin/overview", None, A),
                ("GET", f"/v1/admin/jobs/{completed_id}/outputs/0", None, A),
                ("GET", "/v1/admin/providers", None, A),
                ("POST", "/v1/webhooks/hooked", delivery, signed(delivery))]

        # ---- a lock timeout: a retryable 503 ----------------------------------------------
        assert call(locked, "GET", "/v1/jobs?limit=1", None, H).status == 200
        lock = Lock(database_url, ["operations", "provider_breakers", "webhook_events"])
        try:
            for method, p, body, h in database_calls():
                t.expect("lock timeout", method, p, call(locked, method, p, body, h), 503,
                         "store-busy")
        finally:
            lock.release()

        # ---- a database error: 500 ----------------------------------------------------------
        # A role that may connect but read or write no table: every statement fails for good.
        psql("DO $$ BEGIN CREATE ROLE openapi_noperm LOGIN; "
             "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        noperm = gateway_factory(admin_token_sha256=ADMIN_SHA, providers=providers, **quiet,
                                 env=dict(env, DATABASE_URL=database_url.replace(
                                     "user=postgres", "user=openapi_noperm")))
        for method, p, body, h in database_calls():
            t.expect("database error", method, p, call(noperm, method, p, body, h), 500,
                     "internal")

        # ---- draining: a new request on a kept-alive connection after SIGTERM -------------
        draining = gateway_factory(providers=providers, env=env, **quiet)
        import http.client
        import signal
        ka = http.client.HTTPConnection("127.0.0.1", draining.port, timeout=10)
        ka.request("GET", "/healthz")
        ka.getresponse().read()
        slow = socket.create_connection(("127.0.0.1", draining.port), timeout=10)
        slow.sendall(b"POST /v1/jobs/x/cancel HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n")
        time.sleep(0.2)  # not an assertion: the slow request has begun before the signal
        draining.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while '"shutdown"' not in draining.log() and time.monotonic() < deadline:
            time.sleep(0.01)
        ka.request("GET", "/v1/jobs", headers=H)
        r = ka.getresponse()
        resp = Response(r.status, dict(r.getheaders()), r.read())
        ka.close()
        t.expect("draining", "GET", "/v1/jobs", resp, 503, "shutting-down")
        slow.sendall(b"12345")
        slow.close()
    finally:
        if created:
            ids = ", ".join(f"'{i}'" for i in created)
            psql(f"UPDATE operations SET state = 'failed', finished_at = now(), "
                 f"lease_version = lease_version + 1 WHERE id IN ({ids}) "
                 f"AND state NOT IN ('completed', 'failed', 'canceled')")
        os.rmdir(sockdir)

    assert t.failures == [], "\n".join(t.failures)
    documented = spec.documented_statuses()
    missing = {(op, key) for op, keys in documented.items() for key in keys} - t.covered \
        - NOT_PROVOKED
    assert missing == set(), f"documented but never provoked: {sorted(missing)}"
    undocumented = spec.problem_types() - t.problem_types
    assert undocumented == set(), f"problem types no request produced: {sorted(undocumented)}"


# --- the spec as a standard linter reads it ---------------------------------------------------

def redocly_problems(path):
    """Redocly CLI's recommended rules over one file: its problems as (severity, rule, message)."""
    binary = subprocess.run([os.path.join(ROOT, "scripts", "lint-tools.sh")], check=True,
                            capture_output=True, text=True, timeout=600).stdout.strip()
    r = subprocess.run([binary, "lint", "--format=json", path], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, REDOCLY_TELEMETRY="off",
                                             REDOCLY_SUPPRESS_UPDATE_NOTICE="true"))
    start = r.stdout.find("{")
    assert start >= 0, f"no JSON from the linter (exit {r.returncode}): {r.stderr[-2000:]}"
    doc = json.loads(r.stdout[start:])
    return [(p["severity"], p["ruleId"], p["message"]) for p in doc["problems"]]


def test_spec_passes_a_standard_openapi_linter():
    """docs/openapi.yaml passes Redocly CLI's recommended rules with no error. Our own checks
    above read the spec through PyYAML, which quietly accepts what a stricter reader rejects:
    an unquoted comma in a flow mapping made `when known.` a property of a schema."""
    errors = [p for p in redocly_problems(SPEC_PATH) if p[0] == "error"]
    assert not errors, errors


def test_the_linter_catches_an_unquoted_comma():
    """The linter run above can fail: the same spec with a description's comma unquoted again
    gives the `struct` error that once went unnoticed."""
    text = open(SPEC_PATH).read()
    good = '''description: "The provider's task id, when known."}'''
    assert good in text
    with tempfile.TemporaryDirectory() as d:
        bad = os.path.join(d, "openapi.yaml")
        with open(bad, "w") as f:
            f.write(text.replace(good, "description: The provider's task id, when known.}"))
        errors = [p for p in redocly_problems(bad) if p[0] == "error"]
    assert any(rule == "struct" and "when known." in msg for _, rule, msg in errors), errors
