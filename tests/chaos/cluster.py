"""A PostgreSQL cluster of the test's own, so that stopping it (D1), losing its connections (D2)
or starting a gateway without it (lifecycle) never touches the session's shared cluster.

scripts/pg.sh creates and starts it (as the unprivileged `postgres` user when we are root); the
immediate stop is `pg_ctl stop -m immediate` run as that same user."""

import os
import shutil
import subprocess
import tempfile

from .ports import free_port

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PG_SH = os.path.join(ROOT, "scripts", "pg.sh")
PGBIN = os.environ.get("PGBIN", "/usr/lib/postgresql/15/bin")




def as_owner(cmd):
    return (["runuser", "-u", "postgres", "--"] + cmd) if os.geteuid() == 0 else cmd


def sql(url, timeout=30):
    """A function running one SQL statement against url; rows as lists of strings (the same
    interface as the integration tests' psql fixture)."""
    def run(query):
        out = subprocess.check_output(["psql", url, "-qtAX", "-F", "\t", "-c", query], text=True,
                                      timeout=timeout)
        return [line.split("\t") for line in out.splitlines() if line]
    return run


class Cluster:
    def __init__(self, prefix="idemgate-chaos-pg-"):
        self.dir = tempfile.mkdtemp(prefix=prefix)
        os.chmod(self.dir, 0o755)
        self.port = free_port()
        self.url = None

    @property
    def sock_dir(self):
        return os.path.join(self.dir, "sock")

    @property
    def data_dir(self):
        return os.path.join(self.dir, "data")

    def start(self, timeout=90):
        self.url = subprocess.check_output([PG_SH, "start", self.dir, str(self.port)], text=True,
                                           timeout=timeout).strip()
        return self.url

    def url_for(self, host_dir, dbname="idemgate"):
        """A database of this cluster, reached through a socket directory (a proxy's)."""
        return f"postgresql:///{dbname}?host={host_dir}&port={self.port}&user=postgres"

    def create_db(self, dbname):
        """A fresh database in this cluster (one per test: no work left over by another test can
        reach this test's provider ledger); returns its URL."""
        assert dbname.replace("_", "").isalnum(), dbname
        sql(self.url_for(self.sock_dir, "postgres"))(f"CREATE DATABASE {dbname}")
        return self.url_for(self.sock_dir, dbname)

    def migrate(self, gateway_bin, url=None):
        subprocess.check_call([gateway_bin, "migrate"],
                              env=dict(os.environ, DATABASE_URL=url or self.url),
                              stdout=subprocess.DEVNULL, timeout=60)

    def tenant(self, gateway_bin, name, url=None):
        out = subprocess.check_output([gateway_bin, "tenant", "add", name], text=True,
                                      env=dict(os.environ, DATABASE_URL=url or self.url),
                                      timeout=60)
        return out.strip()

    def is_running(self):
        r = subprocess.run(as_owner([os.path.join(PGBIN, "pg_ctl"), "-D", self.data_dir,
                                     "status"]), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=30)
        return r.returncode == 0

    def stop_immediate(self):
        """pg_ctl stop -m immediate: every backend dies at once, nothing is checkpointed; what
        was committed is recovered from the WAL at the next start."""
        subprocess.run(as_owner([os.path.join(PGBIN, "pg_ctl"), "-D", self.data_dir, "-m",
                                 "immediate", "-w", "-t", "60", "stop"]),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=90)

    def stop(self):
        subprocess.call([PG_SH, "stop", self.dir], timeout=90)

    def destroy(self):
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
