"""The package's own PEP 517 build backend: standard library only, so that
`pip install ./clients/python` works in any fresh virtual environment with no package index
(`--no-index`) and nothing installed beside pip. pip's isolated build environment needs no
package for it (pyproject.toml: `requires = []`, `backend-path`), where setuptools would need
setuptools — and, before setuptools 70.1, the `wheel` package (`invalid command
'bdist_wheel'`) — which a fresh venv may lack (Python 3.12+ venvs ship no setuptools at all).

It builds a pure-Python wheel (py3-none-any) of the `idemgate` package with the metadata of
pyproject.toml's [project] table, an sdist, and an editable wheel (PEP 660: a .pth file that
points at this folder). Entries are written sorted with a fixed timestamp (SOURCE_DATE_EPOCH
when set): the same sources give the same wheel, byte for byte."""

import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "idemgate"
# The files of an sdist besides the package: what building a wheel from it needs.
SDIST_EXTRA = ("pyproject.toml", "README.md", "build_backend/idemgate_build.py")


# --- pyproject.toml ------------------------------------------------------------------------------

def _parse_toml_subset(text):
    """The subset of TOML pyproject.toml uses, for Pythons before 3.11 (no tomllib): [tables],
    `key = "string"`, `key = ["list", "of", "strings"]`, `key = {inline = "table"}`, comments.
    Anything else raises ValueError naming the line."""
    doc, table = {}, None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[([A-Za-z0-9_.-]+)\]", line)
        if m:
            table = doc
            for part in m.group(1).split("."):
                table = table.setdefault(part, {})
            continue
        m = re.fullmatch(r"""([A-Za-z0-9_-]+|"[^"]*")\s*=\s*(.+?)\s*(#[^"\]}]*)?""", line)
        if not m or table is None:
            raise ValueError(f"pyproject.toml:{n}: not understood: {raw!r}")
        table[m.group(1).strip('"')] = _toml_value(m.group(2), n)
    return doc


def _toml_value(v, n):
    if v.startswith('"') and v.endswith('"') and '"' not in v[1:-1]:
        return v[1:-1]
    if v.startswith("[") and v.endswith("]"):
        inner = v[1:-1].strip().rstrip(",")
        return [_toml_value(x.strip(), n) for x in inner.split(",")] if inner else []
    if v.startswith("{") and v.endswith("}"):
        out = {}
        for item in filter(None, (x.strip() for x in v[1:-1].split(","))):
            k, _, val = item.partition("=")
            out[k.strip()] = _toml_value(val.strip(), n)
        return out
    if v in ("true", "false"):
        return v == "true"
    raise ValueError(f"pyproject.toml:{n}: value not understood: {v!r}")


def read_pyproject(root=ROOT):
    with open(os.path.join(root, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        return _parse_toml_subset(text)
    return tomllib.loads(text)


def _project(root=ROOT):
    p = read_pyproject(root)["project"]
    for k in ("name", "version"):
        if not isinstance(p.get(k), str):
            raise ValueError(f"pyproject.toml: [project] {k} is required")
    return p


def _dist_name(p):
    """The distribution name as file names spell it (PEP 427/503): idemgate_client."""
    return re.sub(r"[-_.]+", "_", p["name"]).lower()


def _dist_info(p):
    return f"{_dist_name(p)}-{p['version']}.dist-info"


# --- metadata ------------------------------------------------------------------------------------

def metadata(p, root=ROOT):
    """The core metadata (METADATA / PKG-INFO), version 2.1."""
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}"]
    if p.get("description"):
        lines.append(f"Summary: {p['description']}")
    lic = p.get("license")
    if isinstance(lic, dict) and lic.get("text"):
        lines.append(f"License: {lic['text']}")
    if p.get("requires-python"):
        lines.append(f"Requires-Python: {p['requires-python']}")
    for dep in p.get("dependencies") or []:
        lines.append(f"Requires-Dist: {dep}")
    for c in p.get("classifiers") or []:
        lines.append(f"Classifier: {c}")
    body = ""
    if isinstance(p.get("readme"), str):
        with open(os.path.join(root, p["readme"]), encoding="utf-8") as f:
            body = f.read()
        lines.append("Description-Content-Type: text/markdown" if p["readme"].endswith(".md")
                     else "Description-Content-Type: text/plain")
    return "\n".join(lines) + "\n\n" + body


def _entry_points(p):
    scripts = p.get("scripts") or {}
    if not scripts:
        return None
    return "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(scripts.items()))


def _dist_info_files(p, root=ROOT):
    """{name inside the .dist-info: bytes}, RECORD excluded."""
    files = {
        "METADATA": metadata(p, root).encode("utf-8"),
        "WHEEL": ("Wheel-Version: 1.0\nGenerator: idemgate_build\nRoot-Is-Purelib: true\n"
                  "Tag: py3-none-any\n").encode(),
        "top_level.txt": (PACKAGE + "\n").encode(),
    }
    ep = _entry_points(p)
    if ep:
        files["entry_points.txt"] = ep.encode()
    return files


# --- archives ------------------------------------------------------------------------------------

def _epoch():
    """The timestamp of every entry: SOURCE_DATE_EPOCH, else 1980-01-01 (zip's earliest)."""
    try:
        t = int(os.environ["SOURCE_DATE_EPOCH"])
    except (KeyError, ValueError):
        t = 315532800
    return max(t, 315532800)


def _package_files(root=ROOT):
    """The package's files (relative, '/'-separated), sorted: sources only, no caches."""
    out = []
    base = os.path.join(root, PACKAGE)
    for d, dirs, files in os.walk(base):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__" and not x.startswith("."))
        for f in files:
            if f.endswith((".py", ".typed")):
                out.append(os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/"))
    return sorted(out)


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory, p, entries):
    """entries: [(name in the wheel, bytes)]; adds RECORD, writes the .whl, returns its name."""
    info = _dist_info(p)
    entries = list(entries) + [(f"{info}/{k}", v) for k, v in
                               sorted(_dist_info_files(p).items())]
    record = "".join(_record_line(n, d) + "\n" for n, d in entries) + f"{info}/RECORD,,\n"
    entries.append((f"{info}/RECORD", record.encode()))
    name = f"{_dist_name(p)}-{p['version']}-py3-none-any.whl"
    os.makedirs(wheel_directory, exist_ok=True)
    path = os.path.join(wheel_directory, name)
    stamp = time.gmtime(_epoch())[:6]
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for n, d in entries:
            zi = zipfile.ZipInfo(n, date_time=stamp)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            z.writestr(zi, d)
    os.replace(tmp, path)
    return name


def _read(rel, root=ROOT):
    with open(os.path.join(root, rel), "rb") as f:
        return f.read()


# --- PEP 517 / PEP 660 hooks -------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    p = _project()
    info = _dist_info(p)
    d = os.path.join(metadata_directory, info)
    os.makedirs(d, exist_ok=True)
    for k, v in _dist_info_files(p).items():
        with open(os.path.join(d, k), "wb") as f:
            f.write(v)
    return info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    p = _project()
    return _write_wheel(wheel_directory, p, [(n, _read(n)) for n in _package_files()])


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """A wheel whose only content is a .pth naming this folder: edits take effect at once."""
    p = _project()
    pth = (ROOT + "\n").encode("utf-8")
    return _write_wheel(wheel_directory, p, [(f"__editable__.{_dist_name(p)}.pth", pth)])


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    base = f"{_dist_name(p)}-{p['version']}"
    name = base + ".tar.gz"
    os.makedirs(sdist_directory, exist_ok=True)
    path = os.path.join(sdist_directory, name)
    members = [(n, _read(n)) for n in sorted(set(SDIST_EXTRA) | set(_package_files()))]
    members.append(("PKG-INFO", metadata(p).encode("utf-8")))
    tmp = path + ".tmp"
    with tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT) as t:
        for n, d in sorted(members):
            ti = tarfile.TarInfo(f"{base}/{n}")
            ti.size, ti.mtime, ti.mode = len(d), _epoch(), 0o644
            t.addfile(ti, io.BytesIO(d))
    os.replace(tmp, path)
    return name
