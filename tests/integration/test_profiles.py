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


# What ../shared/PROVIDERS.md (and each provider's own documentation it cites) says of the real
# APIs the shipped profiles describe, pinned so that an edit that contradicts it fails here: the
# task's id, where its status is read, every status word and the state it means, the key the
# provider honours (only the mock's keyed provider has one: none of the real APIs deduplicates),
# the reconcile strategy (none can prove a task absent), the webhook's signature scheme, the
# longest an output URL lives, and whether the cancel deletes the task (Luma's DELETE; Runway's
# "cancel or delete": a finished task is deleted, then reads 404).
FACTS = {
    "openai-videos": dict(task_id="$.id", poll=("GET", "/v1/videos/{id}"),
                          statuses={"queued": "queued", "in_progress": "running",
                                    "completed": "succeeded", "failed": "failed"},
                          webhook="standard_webhooks", cancel=None),
    "replicate": dict(task_id="$.id", poll=("GET", "/v1/predictions/{id}"),
                      statuses={"starting": "queued", "processing": "running",
                                "succeeded": "succeeded", "failed": "failed",
                                "canceled": "canceled", "aborted": "failed"},
                      ttl=3600, webhook="standard_webhooks", cancel=False),
    # fal: a request's status and result are read under the app's id, without the model's
    # subpath (fal-ai/flux, not fal-ai/flux/dev).
    "fal-queue": dict(task_id="$.request_id", poll=("GET", "/fal-ai/flux/requests/{id}/status"),
                      statuses={"IN_QUEUE": "queued", "IN_PROGRESS": "running",
                                "COMPLETED": "succeeded"},
                      ttl=3600, webhook="ed25519", cancel=None),
    "runway": dict(task_id="$.id", poll=("GET", "/v1/tasks/{id}"),
                   statuses={"PENDING": "queued", "THROTTLED": "queued", "RUNNING": "running",
                             "SUCCEEDED": "succeeded", "FAILED": "failed",
                             "CANCELLED": "canceled"},
                   ttl=86400, webhook=None, cancel=True),
    "luma": dict(task_id="$.id", poll=("GET", "/dream-machine/v1/generations/{id}"),
                 statuses={"queued": "queued", "dreaming": "running", "completed": "succeeded",
                           "failed": "failed"},
                 webhook="none", cancel=True),
    "vertex-veo": dict(task_id="$.name", webhook=None, cancel=None),
}


@pytest.mark.parametrize("name", sorted(FACTS))
def test_a_shipped_async_profile_says_what_its_provider_does(name):
    p, want = load(name), FACTS[name]
    assert p["create"]["task_id"] == want["task_id"]
    if "poll" in want:
        assert (p["poll"]["method"], p["poll"]["path"]) == want["poll"]
    if "statuses" in want:
        assert p["status"]["map"] == want["statuses"]
    if "ttl" in want:
        assert p["result"]["url_ttl_seconds"] <= want["ttl"]
    assert (p.get("webhook") or {}).get("verify") == want["webhook"]
    cancel = p.get("cancel")
    assert (None if cancel is None else bool(cancel.get("deletes"))) == want["cancel"]


def test_only_the_keyed_mock_declares_a_provider_key_and_no_profile_proves_absence():
    for name in SHIPPED:
        p = load(name)
        keyed = name == "keyed-async"
        assert ("idempotency" in p) == keyed, name
        strategy = p["reconcile"]["strategy"]
        assert strategy == ("idempotent_resubmit" if keyed else "none"), (name, strategy)
