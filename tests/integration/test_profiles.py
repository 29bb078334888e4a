"""Provider profiles: validated at start with a message naming the file and the field."""

import json
import os
import subprocess

import pytest

from conftest import GATEWAY_BIN, ROOT

PROFILES = os.path.join(ROOT, "deploy", "providers")
SHIPPED = sorted(f[:-5] for f in os.listdir(PROFILES) if f.endswith(".json"))


def check(tmp_path, entry, profile=None):
    if profile is not None:
        (tmp_path / "p.json").write_text(json.dumps(profile))
        entry = dict(entry, profile="p.json")
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"providers": [entry]}))
    r = subprocess.run([GATEWAY_BIN, "--config", str(cfg), "check-config"], capture_output=True,
                       text=True, env=dict(os.environ, DATABASE_URL="postgresql:///none"))
    return r.returncode, r.stdout + r.stderr


def test_every_shipped_profile_is_valid(tmp_path):
    assert len(SHIPPED) >= 8
    for name in SHIPPED:
        code, out = check(tmp_path, {"name": "p", "profile": os.path.join(PROFILES, name + ".json")})
        assert code == 0, (name, out)


def load(name):
    with open(os.path.join(PROFILES, name + ".json")) as f:
        return json.load(f)


@pytest.mark.parametrize("mutate,field", [
    (lambda p: p["status"]["map"].update({"in_progress": "runing"}),
     "status.map.in_progress"),
    (lambda p: p["create"].update({"task_id": "$.id["}), "create.task_id"),
    (lambda p: p["create"].update({"task_id": "id"}), "create.task_id"),
    (lambda p: p["poll"].update({"path": "/v1/videos/{video_id}"}), "poll.path"),
    (lambda p: p["poll"].update({"method": "PATCH"}), "poll.method"),
    (lambda p: p.update({"mode": "streaming"}), "mode"),
    (lambda p: p["result"].update({"kind": "ftp"}), "result.kind"),
    (lambda p: p["webhook"].update({"verify": "md5"}), "webhook.verify"),
    (lambda p: p.pop("status"), "status"),
])
def test_a_profile_mistake_fails_naming_file_and_field(tmp_path, mutate, field):
    prof = load("openai-videos")
    mutate(prof)
    code, out = check(tmp_path, {"name": "vids"}, prof)
    assert code == 1, out
    assert "p.json" in out and f"providers.vids.{field}" in out, out


def test_entry_members_override_the_profile(tmp_path):
    code, out = check(tmp_path, {"name": "vids", "base_url": "http://127.0.0.1:1",
                                 "poll": {"path": "/v2/{id}", "interval_ms": 50}},
                      load("openai-videos"))
    assert code == 0, out
    code, out = check(tmp_path, {"name": "vids", "base_url": "ftp://x"}, load("openai-videos"))
    assert code == 1 and "providers.vids.base_url" in out


def test_missing_profile_file_is_named(tmp_path):
    code, out = check(tmp_path, {"name": "x", "profile": "nope.json"})
    assert code == 1 and "nope.json" in out
