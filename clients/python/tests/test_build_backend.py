"""The package's own build backend (build_backend/idemgate_build.py), called as pip calls it:
the wheel holds every source of the package and metadata that agree with pyproject.toml, its
RECORD hashes are right, two builds are the same bytes, and the sdist builds the same wheel.
Installing it offline into fresh virtual environments is
tests/integration/test_python_install.py."""

import base64
import csv
import hashlib
import io
import os
import sys
import tarfile
import tomllib
import zipfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(PKG, "build_backend"))
sys.path.insert(0, PKG)

import idemgate  # noqa: E402
import idemgate_build  # noqa: E402


def pyproject():
    with open(os.path.join(PKG, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_building_needs_no_package():
    """What makes `pip install --no-index` work in a fresh venv: pip's isolated build
    environment has nothing to install, and the backend is in the tree."""
    bs = pyproject()["build-system"]
    assert bs["requires"] == [] and bs["build-backend"] == "idemgate_build"
    assert bs["backend-path"] == ["build_backend"]
    assert idemgate_build.get_requires_for_build_wheel() == []
    assert idemgate_build.get_requires_for_build_editable() == []


def test_the_toml_subset_parser_reads_pyproject_as_tomllib_does():
    """Pythons before 3.11 (no tomllib) read pyproject.toml with the backend's own parser."""
    with open(os.path.join(PKG, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    assert idemgate_build._parse_toml_subset(text) == tomllib.loads(text)
    with pytest.raises(ValueError, match="pyproject.toml:2"):
        idemgate_build._parse_toml_subset("[a]\nx = 1979-05-27\n")


def test_the_wheel(tmp_path):
    name = idemgate_build.build_wheel(str(tmp_path / "a"))
    assert name == "idemgate_client-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(tmp_path / "a" / name) as z:
        names = z.namelist()
        files = {n: z.read(n) for n in names}
    sources = sorted(f"idemgate/{f}" for f in os.listdir(os.path.join(PKG, "idemgate"))
                     if f.endswith(".py"))
    assert sorted(n for n in names if n.startswith("idemgate/")) == sources
    for s in sources:
        with open(os.path.join(PKG, s), "rb") as f:
            assert files[s] == f.read()
    info = "idemgate_client-0.1.0.dist-info/"
    meta = files[info + "METADATA"].decode()
    project = pyproject()["project"]
    assert f"Name: {project['name']}\n" in meta and f"Version: {project['version']}\n" in meta
    assert project["version"] == idemgate.__version__
    assert "Requires-Python: >=3.9\n" in meta
    assert "Tag: py3-none-any" in files[info + "WHEEL"].decode()
    assert "idemgate-batch = idemgate.batch:main" in files[info + "entry_points.txt"].decode()
    # RECORD names every other file with its hash and size.
    rows = list(csv.reader(io.StringIO(files[info + "RECORD"].decode())))
    assert sorted(r[0] for r in rows) == sorted(names)
    for path, digest, size in rows:
        if path == info + "RECORD":
            assert digest == size == ""
            continue
        want = base64.urlsafe_b64encode(hashlib.sha256(files[path]).digest()).rstrip(b"=")
        assert digest == "sha256=" + want.decode() and int(size) == len(files[path])
    # The same sources, the same bytes.
    idemgate_build.build_wheel(str(tmp_path / "b"))
    assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_the_sdist_builds_the_same_wheel(tmp_path):
    name = idemgate_build.build_sdist(str(tmp_path))
    with tarfile.open(tmp_path / name) as t:
        t.extractall(tmp_path / "x")  # our own archive, just built
    src = tmp_path / "x" / "idemgate_client-0.1.0"
    assert (src / "PKG-INFO").exists() and (src / "build_backend" / "idemgate_build.py").exists()
    # The unpacked sdist builds its wheel with its own copy of the backend.
    import subprocess
    code = ("import sys; sys.path.insert(0, 'build_backend'); import idemgate_build as b; "
            f"print(b.build_wheel({str(tmp_path / 'w')!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True,
                         check=True)
    wheel = out.stdout.strip()
    ours = idemgate_build.build_wheel(str(tmp_path / "o"))
    assert (tmp_path / "w" / wheel).read_bytes() == (tmp_path / "o" / ours).read_bytes()


def test_the_editable_wheel_points_at_the_sources(tmp_path):
    name = idemgate_build.build_editable(str(tmp_path))
    with zipfile.ZipFile(tmp_path / name) as z:
        pth = z.read("__editable__.idemgate_client.pth").decode().strip()
        assert "idemgate_client-0.1.0.dist-info/entry_points.txt" in z.namelist()
    assert os.path.samefile(pth, PKG)
