"""Unknown members of the configuration and of provider profiles are refused at load time.

A misspelt member (`timeout` for `timeouts`, `default_wait` for `default_wait_seconds`) used to be
ignored, and its default silently applied. Now `idemgate serve` refuses to start and
`idemgate check-config` fails, both with exit status 1 and a message naming the JSON path of the
member and the nearest valid name at that place (none when nothing is close)."""

import json
import os
import subprocess

import pytest

from conftest import GATEWAY_BIN, ROOT, provider

PROFILES = os.path.join(ROOT, "deploy", "providers")


def run(tmp_path, cfg, command):
    """Runs `idemgate --config cfg.json COMMAND`; the database is never reached (the
    configuration is read first), so none is needed."""
    path = tmp_path / "cfg.json"
    path.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    env = dict(os.environ, DATABASE_URL="postgresql:///idemgate_test_no_such_db?connect_timeout=1")
    for k in list(env):
        if k.startswith("IDEMGATE_"):
            env.pop(k)
    r = subprocess.run([GATEWAY_BIN, "--config", str(path), command], capture_output=True,
                       text=True, env=env, timeout=30)
    return r.returncode, r.stdout, r.stderr


def three_providers(**third_extra):
    return {"providers": [provider("a", "http://127.0.0.1:1"),
                          provider("b", "http://127.0.0.1:1"),
                          provider("c", "http://127.0.0.1:1", **third_extra)]}


def profile_copy(tmp_path, name, mutate):
    with open(os.path.join(PROFILES, name + ".json")) as f:
        prof = json.load(f)
    mutate(prof)
    (tmp_path / "p.json").write_text(json.dumps(prof))
    return {"providers": [{"name": "vids", "profile": "p.json"}]}


def with_route_member(cfg, **members):
    cfg["providers"][0]["routes"][0].update(members)
    return cfg


CASES = [
    # (id, configuration builder, the path, the suggestion or None)
    ("entry", lambda tmp: three_providers(timeout=5), "providers[2].timeout", "timeouts"),
    ("route", lambda tmp: with_route_member(three_providers(), default_wait=5),
     "providers[0].routes[0].default_wait", "default_wait_seconds"),
    ("nested", lambda tmp: three_providers(timeouts={"connect_ms": 1000, "total": 5000}),
     "providers[2].timeouts.total", "total_ms"),
    ("archive", lambda tmp: three_providers(archive={"hosts": ["cdn.example"], "timeout": 9000}),
     "providers[2].archive.timeout", "timeout_ms"),
    ("root", lambda tmp: {"max_wait": 30, "providers": []}, "max_wait", "max_wait_seconds"),
    ("root-nothing-close", lambda tmp: {"default_wait": 30}, "default_wait", None),
    ("entry-nothing-close", lambda tmp: three_providers(colour="red"), "providers[2].colour",
     None),
]


@pytest.mark.parametrize("command", ["serve", "check-config"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_an_unknown_member_is_refused_with_its_path_and_the_nearest_name(tmp_path, command,
                                                                         case):
    _, build, path, suggest = case
    code, out, err = run(tmp_path, build(tmp_path), command)
    assert code == 1, (out, err)
    assert "listening" not in out + err
    line = f"idemgate: invalid configuration: {tmp_path / 'cfg.json'}: unknown member {path}"
    if suggest:
        line += f' (did you mean "{suggest}"?)'
    assert err.strip() == line, err


@pytest.mark.parametrize("command", ["serve", "check-config"])
def test_an_unknown_member_of_a_profile_file_names_the_profile_and_the_entry(tmp_path, command):
    cfg = profile_copy(tmp_path, "openai-videos", lambda p: p["poll"].update(intervl_ms=500))
    code, out, err = run(tmp_path, cfg, command)
    assert code == 1, (out, err)
    assert (f"{tmp_path}/p.json: unknown member poll.intervl_ms "
            f'(did you mean "interval_ms"?), in the profile of providers[0] of '
            f"{tmp_path / 'cfg.json'}") in err, err


def test_a_misspelt_price_in_a_variant_table_is_refused(tmp_path):
    def mutate(p):
        p["pricing"]["variants"]["tables"]["gpt-image-1"]["per_outptu"] = 1000
    cfg = profile_copy(tmp_path, "openai-images", mutate)
    code, out, err = run(tmp_path, cfg, "check-config")
    assert code == 1, (out, err)
    assert ("unknown member pricing.variants.tables.gpt-image-1.per_outptu "
            '(did you mean "per_output"?)') in err, err


def test_a_member_written_twice_is_refused(tmp_path):
    # cJSON keeps both and reads the first: the second would be ignored.
    text = json.dumps(three_providers())[:-1] + ', "lease_seconds": 60, "lease_seconds": 120}'
    code, out, err = run(tmp_path, text, "check-config")
    assert code == 1, (out, err)
    assert "duplicate member lease_seconds" in err, err

