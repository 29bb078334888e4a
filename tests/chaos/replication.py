"""A PostgreSQL primary with a streaming standby of the test's own (issue 14 §3), both on Unix
sockets in temporary folders, owned by the unprivileged `postgres` user when we are root.

The primary is a chaos Cluster (scripts/pg.sh). The standby is a pg_basebackup of it, started
by the same script on a port of its own, streaming from the primary under the application name
`standby1`. Replication is synchronous when the primary names that standby in
`synchronous_standby_names` (each COMMIT then returns only once the standby has flushed its
WAL: `synchronous_commit = on`, PostgreSQL's default) and asynchronous otherwise.

The primary dies by SIGKILL to its postmaster and every child of it at once — the whole server
gone in an instant, as when its machine fails; nothing is shut down or checkpointed. Every
signal goes to a process this harness started (found from the postmaster.pid file it wrote)."""

import os
import signal
import subprocess
import time

from .cluster import PG_SH, PGBIN, Cluster, as_owner, sql

STANDBY_NAME = "standby1"


def _children(pid):
    """The PIDs whose parent is pid (read from /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: the fields follow the last ')'.
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            out.append(int(d))
    return out


class Replicated:
    """A primary and one standby. `url(db)` is the multi-host connection string the gateway
    uses: both servers, and libpq keeps only the one that accepts writes."""

    def __init__(self):
        self.primary = Cluster(prefix="idemgate-fo-primary-")
        self.standby = Cluster(prefix="idemgate-fo-standby-")
        self.killed = False
        self.promoted = False

    # --- set-up ---------------------------------------------------------------------------

    def start_primary(self):
        self.primary.start()
        return self

    def start_standby(self, timeout=120):
        """A base backup of the primary, streaming from it under STANDBY_NAME; returns once it
        accepts read-only connections."""
        p, s = self.primary, self.standby
        if os.geteuid() == 0:
            os.chown(s.dir, _uid("postgres"), -1)
        subprocess.check_call(as_owner([
            os.path.join(PGBIN, "pg_basebackup"), "-D", s.data_dir, "-h", p.sock_dir, "-p",
            str(p.port), "-U", "postgres", "-X", "stream", "-c", "fast", "--no-sync"]),
            stdout=subprocess.DEVNULL, timeout=timeout)
        conninfo = (f"host={p.sock_dir} port={p.port} user=postgres "
                    f"application_name={STANDBY_NAME}")
        auto = os.path.join(s.data_dir, "postgresql.auto.conf")
        subprocess.run(as_owner(["sh", "-c", f"cat >> '{auto}' && touch "
                                             f"'{os.path.join(s.data_dir, 'standby.signal')}'"]),
                       input=f"primary_conninfo = '{conninfo}'\n", text=True, check=True,
                       timeout=30)
        s.url = subprocess.check_output([PG_SH, "start", s.dir, str(s.port)], text=True,
                                        timeout=timeout).strip()
        return self

    def set_synchronous(self, on):
        """Names the standby in the primary's synchronous_standby_names (on) or clears it
        (asynchronous replication), then waits until pg_stat_replication says so."""
        q = self.admin(self.primary)
        q(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME if on else ''}'")
        q("SELECT pg_reload_conf()")
        want = "sync" if on else "async"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = q("SELECT sync_state FROM pg_stat_replication "
                     f"WHERE application_name = '{STANDBY_NAME}' AND state = 'streaming'")
            if rows == [[want]]:
                return
            time.sleep(0.1)
        raise AssertionError(f"the standby never became {want}: {rows}")

    def detach_standby(self):
        """Stops the standby's WAL receiver (its primary_conninfo emptied and reloaded): from
        now on nothing the primary commits reaches it. Returns once the receiver is gone."""
        q = self.admin(self.standby)
        q("ALTER SYSTEM SET primary_conninfo = ''")
        q("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if q("SELECT count(*) FROM pg_stat_wal_receiver") == [["0"]]:
                return
            time.sleep(0.1)
        raise AssertionError("the standby's WAL receiver did not stop")

    # --- faults ----------------------------------------------------------------------------

    def postmaster_pid(self, c):
        with open(os.path.join(c.data_dir, "postmaster.pid")) as f:
            return int(f.readline())

    def kill_primary(self):
        """SIGKILL to the primary's postmaster and all its children at once."""
        pid = self.postmaster_pid(self.primary)
        victims = [pid] + _children(pid)
        for v in victims:
            try:
                os.kill(v, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(v) for v in victims):
            time.sleep(0.05)
        self.killed = True
        return len(victims)

    def fence_primary(self):
        """The primary stays up with its sessions open but accepts no more writes
        (`default_transaction_read_only = on`, reloaded): a switchover's first step, or an
        operator fencing a primary before promoting its standby."""
        q = self.admin(self.primary)
        q("ALTER SYSTEM SET default_transaction_read_only = on")
        q("SELECT pg_reload_conf()")
        self.killed = True

    def promote(self, timeout=60):
        subprocess.check_call(as_owner([os.path.join(PGBIN, "pg_ctl"), "-D",
                                        self.standby.data_dir, "-w", "-t", str(timeout),
                                        "promote"]), stdout=subprocess.DEVNULL, timeout=timeout + 30)
        self.promoted = True

    # --- access ----------------------------------------------------------------------------

    def url(self, dbname, extra=""):
        """Both servers in one libpq connection string; `target_session_attrs=read-write`
        makes libpq skip a server that does not accept writes (a standby, a dead primary)."""
        p, s = self.primary, self.standby
        return (f"host={p.sock_dir},{s.sock_dir} port={p.port},{s.port} dbname={dbname} "
                f"user=postgres target_session_attrs=read-write connect_timeout=2{extra}")

    def admin(self, c, dbname="postgres"):
        return sql(c.url_for(c.sock_dir, dbname))

    def writable(self, dbname):
        """SQL on whichever server accepts writes now."""
        return sql(self.url(dbname))

    def destroy(self):
        for c in (self.standby, self.primary):
            try:
                if c.is_running():
                    c.stop()
            except Exception:
                pass
            import shutil
            shutil.rmtree(c.dir, ignore_errors=True)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _uid(name):
    import pwd
    return pwd.getpwnam(name).pw_uid
