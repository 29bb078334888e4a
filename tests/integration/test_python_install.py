"""The Python package (clients/python) installs OFFLINE into a fresh virtual environment —
`python3 -m venv` without --system-site-packages, nothing added to it — with the README's
command, `pip install ./clients/python`, and its console script and modules work from there
(issue 24 §9: it failed with `invalid command 'bdist_wheel'` unless Debian's setuptools and
wheel were borrowed through --system-site-packages).

pip's configuration is ignored (PIP_CONFIG_FILE=/dev/null, no PIP_* variables: a machine's
find-links or index cannot help), and the index is either off (--no-index) or a closed port.
The interpreter is the one running the tests (Debian's python3: the python3-venv package,
which `make deps` installs); IDEMGATE_TEST_PYTHONS (paths separated by ':') adds others, e.g.
a Python 3.9 or 3.13, whose venvs ship other pip and setuptools versions or none.

No gateway and no database: a venv and pip only."""

import json
import os
import socket
import subprocess
import sys

import pytest

from conftest import ROOT

PKG = os.path.join(ROOT, "clients", "python")
PYTHONS = [sys.executable] + [p for p in os.environ.get("IDEMGATE_TEST_PYTHONS", "").split(":")
                              if p]


def offline_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1",
               PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


def make_venv(python, venv):
    subprocess.run([python, "-m", "venv", str(venv)], check=True, capture_output=True,
                   timeout=300)
    with open(os.path.join(venv, "pyvenv.cfg")) as f:
        cfg = f.read()
    assert "include-system-site-packages = false" in cfg, cfg
    return venv


def install(python, venv, pip_args, cwd=None, env=None):
    """A fresh venv at venv with `pip install --no-index *pip_args` run in it; returns venv."""
    make_venv(python, venv)
    p = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "--no-index", *pip_args],
                       env=env or offline_env(), cwd=cwd, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return venv


def tree_state():
    """git's view of clients/python, ignored files included: installing must not write there."""
    return subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--ignored", "--",
                           "clients/python"], capture_output=True, text=True, check=True).stdout


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: a connection is refused
    return port


def check_installed(venv):
    """The console script and the package, run from the venv (not from the source tree)."""
    bin_ = os.path.join(venv, "bin")
    env = offline_env()
    top = subprocess.run([os.path.join(bin_, "idemgate-batch"), "--help"], env=env, cwd="/",
                         capture_output=True, text=True, timeout=60)
    assert top.returncode == 0, top.stderr
    run = subprocess.run([os.path.join(bin_, "idemgate-batch"), "run", "--help"], env=env,
                         cwd="/", capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    for text in (" ".join(top.stdout.split()), " ".join(run.stdout.split())):
        assert "idemgate-batch run" in text and "CSV" in text and "JSONL" in text, text
        # Every option with a default says what it is.
        for opt, default in (("--concurrency", "2"), ("--wait", "20"), ("--row-timeout", "600"),
                             ("--archive-timeout", "120"), ("--retries", "6"),
                             ("--format", "auto"), ("--state", "MANIFEST.state.sqlite"),
                             ("--results", "MANIFEST.results.jsonl"),
                             ("--out", "MANIFEST.outputs/")):
            assert opt in text and f"(default: {default})" in text, (opt, default, text)
    code = ("import json, idemgate, idemgate.batch as b\n"
            "from idemgate import Client, OutputsUnavailable, derive_key\n"
            "print(json.dumps({'file': idemgate.__file__, 'version': idemgate.__version__,\n"
            "                  'key': derive_key({'product': 'sku-1', 'variant': 1}),\n"
            "                  'main': callable(b.main)}))")
    p = subprocess.run([os.path.join(bin_, "python"), "-c", code], env=env, cwd="/",
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["file"].startswith(str(venv)) and "site-packages" in got["file"], got
    sys.path.insert(0, PKG)
    import idemgate
    assert got["version"] == idemgate.__version__ and got["main"]
    assert got["key"] == idemgate.derive_key({"product": "sku-1", "variant": 1})


@pytest.mark.parametrize("python", PYTHONS)
def test_installs_offline_into_a_fresh_venv(python, tmp_path):
    """`pip install --no-index ./clients/python`, run from the repository as the README says."""
    before = tree_state()
    venv = install(python, tmp_path / "venv", ["./clients/python"], cwd=ROOT)
    check_installed(venv)
    assert tree_state() == before, "installing wrote into the source tree"


def test_a_plain_pip_install_asks_no_index(tmp_path):
    """The README's plain `pip install ./clients/python`, with the index a closed port: it
    installs, so building the package fetched nothing."""
    venv = make_venv(sys.executable, tmp_path / "venv")
    env = offline_env(PIP_INDEX_URL=f"http://127.0.0.1:{closed_port()}/simple",
                      PIP_RETRIES="0", PIP_TIMEOUT="5")
    p = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "./clients/python"],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    check_installed(venv)
