"""A PgBouncer of the test's own (Debian's `pgbouncer`) in front of a chaos Cluster: Unix
socket only (`listen_addr` empty), in a temporary folder, run as the unprivileged `postgres`
user when we are root (PgBouncer refuses to run as root). Stopped by the PID it was started
with."""

import os
import shutil
import signal
import subprocess
import tempfile
import time

from .cluster import as_owner, free_port

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


class PgBouncer:
    def __init__(self, cluster, dbname, pool_mode, pool_size=4):
        self.cluster = cluster
        self.dbname = dbname
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.dir = tempfile.mkdtemp(prefix=f"idemgate-pgb-{pool_mode}-")
        os.chmod(self.dir, 0o755)
        self.port = free_port()
        self.proc = None

    @property
    def log_path(self):
        return os.path.join(self.dir, "pgbouncer.log")

    @property
    def url(self):
        return f"host={self.dir} port={self.port} dbname={self.dbname} user=postgres"

    def start(self, timeout=30):
        c = self.cluster
        with open(os.path.join(self.dir, "users.txt"), "w") as f:
            f.write('"postgres" ""\n')
        ini = f"""[databases]
{self.dbname} = host={c.sock_dir} port={c.port} dbname={self.dbname}

[pgbouncer]
listen_addr =
listen_port = {self.port}
unix_socket_dir = {self.dir}
auth_type = trust
auth_file = {self.dir}/users.txt
pool_mode = {self.pool_mode}
default_pool_size = {self.pool_size}
max_client_conn = 400
logfile = {self.log_path}
pidfile =
server_reset_query = DISCARD ALL
admin_users = postgres
"""
        with open(os.path.join(self.dir, "pgbouncer.ini"), "w") as f:
            f.write(ini)
        if os.geteuid() == 0:
            import pwd
            uid = pwd.getpwnam("postgres").pw_uid
            for p in [self.dir] + [os.path.join(self.dir, n) for n in os.listdir(self.dir)]:
                os.chown(p, uid, -1)
        self.proc = subprocess.Popen(as_owner([PGBOUNCER, os.path.join(self.dir,
                                                                       "pgbouncer.ini")]),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sock = os.path.join(self.dir, f".s.PGSQL.{self.port}")
        deadline = time.monotonic() + timeout
        while not os.path.exists(sock):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not start: {self.log()[-2000:]}")
            time.sleep(0.05)
        return self

    def pools(self):
        """SHOW POOLS of the admin console: {column: int} for this database's pool."""
        out = subprocess.check_output(["psql", f"host={self.dir} port={self.port} "
                                       "dbname=pgbouncer user=postgres", "-AX", "-F", "\t", "-c",
                                       "SHOW POOLS"], text=True, timeout=30)
        lines = [l.split("\t") for l in out.splitlines() if "\t" in l]
        head = lines[0]
        for row in lines[1:]:
            d = dict(zip(head, row))
            if d.get("database") == self.dbname:
                return {k: int(v) for k, v in d.items() if v.isdigit()}
        return {}

    def log(self):
        try:
            with open(self.log_path) as f:
                return f.read()
        except OSError:
            return ""

    def close(self):
        if self.proc and self.proc.poll() is None:
            # runuser passes SIGTERM on to pgbouncer (its child) and waits for it.
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
