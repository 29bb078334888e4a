"""The command-line tool: tenants, jobs list/show/resolve, check-config, --help."""

import json
import os
import subprocess
import uuid

from conftest import GATEWAY_BIN, ROOT, provider


def cli(database_url, *args):
    return subprocess.run([GATEWAY_BIN, *args], capture_output=True, text=True,
                          env=dict(os.environ, DATABASE_URL=database_url))


def test_tenant_lifecycle(database_url):
    name = "cli-" + uuid.uuid4().hex[:8]
    add = cli(database_url, "tenant", "add", name)
    assert add.returncode == 0 and add.stdout.strip().startswith("igt_")
    assert cli(database_url, "tenant", "add", name).returncode == 1, "names are unique"
    assert name in cli(database_url, "tenant", "list").stdout
    assert cli(database_url, "tenant", "revoke", name).returncode == 0
    assert cli(database_url, "tenant", "revoke", name).returncode == 1
    assert "revoked" in [l for l in cli(database_url, "tenant", "list").stdout.splitlines()
                         if name in l][0]


def test_a_misspelt_option_is_refused_before_anything_is_done(database_url, psql):
    """`tenant budget acme --daily 10` (for --day) used to run as if no option were given: exit 0
    and the day's budget cleared. Every option of budget, usage and jobs is checked first."""
    name = "cli-" + uuid.uuid4().hex[:8]
    assert cli(database_url, "tenant", "add", name).returncode == 0
    set_ = cli(database_url, "tenant", "budget", name, "--currency", "USD", "--day", "10")
    assert set_.returncode == 0, set_.stderr
    row = f"SELECT day_limit_micros FROM tenant_budgets b JOIN tenants t ON t.id = b.tenant_id " \
          f"WHERE t.name = '{name}'"
    assert psql(row) == [["10000000"]]
    for args, bad in ((("tenant", "budget", name, "--daily", "20"), "--daily"),
                      (("tenant", "budget", name, "--day", "20", "--day", "30"), "--day"),
                      (("tenant", "budget", name, "--day"), "--day"),
                      (("usage", "--bogus", "x"), "--bogus"),
                      (("jobs", "list", "--sate", "review"), "--sate"),
                      (("jobs", "list", "--limit", "ten"), "--limit"),
                      (("jobs", "show", "job_x", "extra"), "extra")):
        r = cli(database_url, *args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert bad in r.stderr, (args, r.stderr)
    assert psql(row) == [["10000000"]], "the budget was not touched"


def test_jobs_list_show_resolve(gateway_factory, token, mock, database_url):
    gw = gateway_factory(providers=[provider(
        "c", mock.url, timeouts={"connect_ms": 1000, "total_ms": 1000},
        reconcile={"strategy": "none", "window_seconds": 2})])
    mock.script([{"fault": "hang"}])
    r = gw.submit(token, "cli-" + uuid.uuid4().hex, {"prompt": "x"}, route="c/images/generations")
    job_id = r.json()["id"]
    gw.wait_state(token, job_id, {"review"}, timeout=20)
    listed = cli(database_url, "jobs", "list", "--state", "review")
    assert listed.returncode == 0 and job_id in listed.stdout
    shown = cli(database_url, "jobs", "show", job_id)
    assert shown.returncode == 0 and json.loads(shown.stdout)["state"] == "review"
    res = cli(database_url, "jobs", "resolve", job_id, "abandon", "--operator", "bob")
    assert res.returncode == 0, res
    job = gw.job(token, job_id).json()
    assert job["state"] == "failed" and "bob" in job["resolution"]["by"]
    again = cli(database_url, "jobs", "resolve", job_id, "abandon")
    assert again.returncode == 0 and "already" in again.stdout
    assert cli(database_url, "jobs", "resolve", job_id, "found").returncode == 2, "needs --remote-id"
    assert cli(database_url, "jobs", "show", "job_nope").returncode == 1
    assert cli(database_url, "jobs", "list", "--state", "bogus").returncode == 2
    assert cli(database_url, "jobs", "list", "--state", "canceled").returncode == 0


def test_help_and_check_config(tmp_path):
    for args in (["--help"], ["tenant", "--help"], ["jobs", "--help"], ["serve", "--help"],
                 ["migrate", "--help"], ["check-config", "--help"]):
        r = subprocess.run([GATEWAY_BIN, *args], capture_output=True, text=True)
        assert r.returncode == 0 and "usage" in r.stdout, args
    # `jobs --help` names every state `--state` takes, the terminal canceled included.
    r = subprocess.run([GATEWAY_BIN, "jobs", "--help"], capture_output=True, text=True)
    states = ["prepared", "sending", "accepted", "unknown", "review", "completed", "failed",
              "canceled"]
    assert ", ".join(states) in r.stdout, r.stdout
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"lease_seconds": "soon"}))
    r = subprocess.run([GATEWAY_BIN, "--config", str(bad), "check-config"], capture_output=True,
                       text=True)
    assert r.returncode == 1 and "lease_seconds" in r.stderr and str(bad) in r.stderr


def test_check_config_names_a_provider_whose_output_urls_are_never_copied(tmp_path):
    """An async provider whose outputs are URLs, with no archive host declared (the shipped
    profiles declare none): every copy is refused and the provider's URLs expire — check-config
    says so, naming the provider; declared hosts silence it, and a text provider (or a
    synchronous one, whose outputs may be base64) is never named."""
    profiles = os.path.join(ROOT, "deploy", "providers")

    def check(entries):
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps({"providers": entries}))
        r = subprocess.run([GATEWAY_BIN, "--config", str(cfg), "check-config"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stderr

    rep = {"name": "rep", "profile": os.path.join(profiles, "replicate.json")}
    chat = {"name": "chat", "profile": os.path.join(profiles, "openai-chat.json")}
    images = {"name": "images", "profile": os.path.join(profiles, "openai-images.json")}
    err = check([rep, chat, images])
    assert "providers.rep.archive.hosts" in err, err
    assert "providers.chat.archive" not in err and "providers.images.archive" not in err, err
    rep["archive"] = {"hosts": [".replicate.delivery"]}
    assert "archive.hosts" not in check([rep])


def test_an_s3_archive_refuses_outputs_it_could_never_store(tmp_path):
    """The S3 store writes an object with one PUT, which S3 takes up to 5 GiB: an archive that
    allows bigger outputs would have each such copy refused until its URL expired. The
    configuration is refused at start, naming the provider; 5 GiB, or a local store, is fine."""
    rep = {"name": "rep", "profile": os.path.join(ROOT, "deploy", "providers", "replicate.json"),
           "archive": {"hosts": [".replicate.delivery"], "max_bytes": 6 * 1024 ** 3}}
    s3 = {"archive_backend": "s3", "archive_s3_endpoint": "http://127.0.0.1:9",
          "archive_s3_bucket": "b"}

    def check(settings):
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps(dict(settings, providers=[rep])))
        return subprocess.run([GATEWAY_BIN, "--config", str(cfg), "check-config"],
                              capture_output=True, text=True)

    r = check(s3)
    assert r.returncode == 1 and "providers.rep.archive.max_bytes" in r.stderr, r.stderr
    assert check({}).returncode == 0
    rep["archive"]["max_bytes"] = 5 * 1024 ** 3
    assert check(s3).returncode == 0, check(s3).stderr


def test_docs_settings_table_is_the_config_reference():
    """docs/configuration.md's table is `idemgate config-reference`, row for row: a setting
    added to src/config.c (or changed there) without the docs, or the other way round, fails."""
    out = subprocess.check_output([GATEWAY_BIN, "config-reference"], text=True)
    reference = [line for line in out.splitlines() if line.startswith("| `")]
    with open(os.path.join(ROOT, "docs", "configuration.md")) as f:
        readme = f.read()
    start = readme.index("| setting | environment | default | meaning |")
    table = []
    for line in readme[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        table.append(line)
    assert len(reference) > 20
    assert table == reference


def test_a_database_url_that_cannot_be_read_is_never_logged(database_url):
    """libpq quotes a URL it cannot parse whole in its error, password included: the failed
    connection's log line carried it (`db_unavailable`). It names the problem now, never the
    text. A URL that parses still gets libpq's own reason (no URL in it)."""
    for url, fragment in (("postgresql://idemgate:S3cr3tPw@[::1]x/idemgate", "S3cr3tPw"),
                          ("postgresql://idemgate:S3%zzcret@localhost/idemgate", "zzcret")):
        out = cli(url, "tenant", "list")
        assert out.returncode != 0, out
        assert fragment not in out.stdout + out.stderr, out.stderr
        assert "not a valid libpq connection string" in out.stderr, out.stderr
