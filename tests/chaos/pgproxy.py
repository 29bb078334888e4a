"""A PostgreSQL wire-protocol proxy on a Unix socket that loses connections on purpose (D2).

The gateway's DATABASE_URL points at the proxy's socket directory; the proxy forwards every byte
to the real cluster's socket and reads the message framing on the way. When a Bind names a chosen
prepared statement (`intake`, `claim`, `finish`, …; `intake_plain` and `intake_rows`, the group
commit's, are an `intake`, `begin_send_rows` a `begin_send`, `finish_rows` a `finish`) it may:

- `before`: close both sides before the Bind reaches the server: the statement never ran;
- `after` : forward the statement, hold back everything the server answers, and close both sides
            when the server's ReadyForQuery arrives. libpq sends Bind/Execute/Sync together and
            the server commits the implicit transaction at Sync, before ReadyForQuery: the
            statement **committed** but the gateway only sees its connection die in the middle
            of the COMMIT.

The gateway cannot tell the two apart; only a re-read can decide. Every injected fault is
recorded (statement, mode, and for `after` whether the server reported an error).

A third mode, `delay:N`, lets the statement run and commit but holds its answer back N seconds:
a stall between a COMMIT and the gateway reading its result."""

import os
import random
import socket
import threading
import time

SSL_REQUEST = 80877103
GSS_REQUEST = 80877104
# Statements that are one kind for the scenarios: the group commit's intakes are an intake, a
# batch's start of sending a begin_send, a batch's results a finish, a batch of the archive's
# copy ends an archive_finish.
ALIASES = {"intake_plain": "intake", "intake_rows": "intake", "begin_send_rows": "begin_send",
           "finish_rows": "finish", "archive_finish_rows": "archive_finish"}


class PgProxy:
    def __init__(self, upstream_dir, listen_dir, port):
        self.upstream = os.path.join(upstream_dir, f".s.PGSQL.{port}")
        self.listen_dir = listen_dir
        self.path = os.path.join(listen_dir, f".s.PGSQL.{port}")
        self.lock = threading.Lock()
        self.plan = {}       # stmt -> [mode, ...] consumed first
        self.rules = {}      # stmt -> (p_before, p_after)
        self.budget = 0      # faults the random rules may still inject
        self.injected = []   # (time, stmt, mode, committed): mode before | after | delay
        self.statements = {}  # stmt -> Binds seen
        self.released = []   # stmt of each delayed answer once it reached the gateway
        self.enabled = True
        self.conns = set()
        self._stop = threading.Event()
        self._srv = None

    # --- control -------------------------------------------------------------------------------
    def fail_next(self, stmt, *modes):
        with self.lock:
            self.plan.setdefault(stmt, []).extend(modes)

    def delay_next(self, stmt, seconds):
        """The next execution of stmt runs and commits at once, but its answer reaches the
        gateway `seconds` later (a stall between the COMMIT and the client reading it)."""
        self.fail_next(stmt, f"delay:{seconds}")

    def randomly(self, budget, **rules):
        """rules: stmt=(p_before, p_after); at most `budget` faults in all."""
        with self.lock:
            self.rules.update(rules)
            self.budget = budget

    def quiet(self):
        with self.lock:
            self.plan.clear()
            self.rules.clear()
            self.budget = 0

    def count(self, stmt=None, mode=None):
        with self.lock:
            return sum(1 for _, s, m, _c in self.injected
                       if (stmt is None or s == stmt) and (mode is None or m == mode))

    def _decide(self, stmt):
        with self.lock:
            self.statements[stmt] = self.statements.get(stmt, 0) + 1
            q = self.plan.get(stmt)
            if q:
                return q.pop(0)
            rule = self.rules.get(stmt)
            if not rule or self.budget <= 0:
                return None
            x = random.random()
            mode = "before" if x < rule[0] else "after" if x < rule[0] + rule[1] else None
            if mode:
                self.budget -= 1
            return mode

    def _record(self, stmt, mode, committed=None):
        with self.lock:
            self.injected.append((time.time(), stmt, mode, committed))

    # --- server --------------------------------------------------------------------------------
    def start(self):
        os.makedirs(self.listen_dir, exist_ok=True)
        if os.path.exists(self.path):
            os.unlink(self.path)
        self._srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._srv.bind(self.path)
        os.chmod(self.path, 0o777)
        self._srv.listen(128)
        self._srv.settimeout(0.2)
        threading.Thread(target=self._accept_loop, daemon=True).start()
        return self

    def close(self):
        self._stop.set()
        if self._srv:
            self._srv.close()
        for c in list(self.conns):
            _kill(*c)
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def _accept_loop(self):
        while not self._stop.is_set():
            try:
                client, _ = self._srv.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                up.connect(self.upstream)
            except OSError:  # the server is down: the client sees its connection refused/closed
                client.close()
                up.close()
                continue
            pair = (client, up)
            self.conns.add(pair)
            st = {"pending": None, "raw": False}
            threading.Thread(target=self._c2s, args=(pair, st), daemon=True).start()
            threading.Thread(target=self._s2c, args=(pair, st), daemon=True).start()

    def _c2s(self, pair, st):
        client, up = pair
        buf, first = b"", True
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                buf += data
                while buf:
                    if st["raw"]:
                        up.sendall(buf)
                        buf = b""
                        break
                    if first:  # untyped: SSL/GSS request or the startup message
                        if len(buf) < 8:
                            break
                        n = int.from_bytes(buf[:4], "big")
                        if len(buf) < n:
                            break
                        code = int.from_bytes(buf[4:8], "big")
                        if code in (SSL_REQUEST, GSS_REQUEST):
                            st["raw"] = True  # not on Unix sockets; never faulted if it happens
                        else:
                            first = False
                        up.sendall(buf[:n])
                        buf = buf[n:]
                        continue
                    if len(buf) < 5:
                        break
                    n = int.from_bytes(buf[1:5], "big")
                    if len(buf) < 1 + n:
                        break
                    msg, buf = buf[:1 + n], buf[1 + n:]
                    if msg[:1] == b"B":
                        payload = msg[5:]
                        p_end = payload.index(b"\0")
                        stmt = payload[p_end + 1:payload.index(b"\0", p_end + 1)].decode()
                        stmt = ALIASES.get(stmt, stmt)
                        mode = self._decide(stmt)
                        if mode == "before":
                            self._record(stmt, "before", False)
                            return
                        if mode == "after":
                            st["pending"] = stmt
                        elif mode and mode.startswith("delay:"):
                            st["delay"] = float(mode.split(":", 1)[1])
                            st["pending"] = stmt
                    up.sendall(msg)
        except OSError:
            pass
        finally:
            _kill(client, up)
            self.conns.discard(pair)

    def _s2c(self, pair, st):
        client, up = pair
        buf, held = b"", []
        try:
            while True:
                data = up.recv(65536)
                if not data:
                    break
                if st["raw"]:
                    client.sendall(data)
                    continue
                buf += data
                while len(buf) >= 5:
                    n = int.from_bytes(buf[1:5], "big")
                    if len(buf) < 1 + n:
                        break
                    msg, buf = buf[:1 + n], buf[1 + n:]
                    if st["pending"]:
                        held.append(msg)
                        if msg[:1] == b"Z":
                            committed = not any(m[:1] == b"E" for m in held)
                            if st.get("delay"):
                                self._record(st["pending"], "delay", committed)
                                time.sleep(st["delay"])
                                client.sendall(b"".join(held))
                                with self.lock:
                                    self.released.append(st["pending"])
                                held, st["pending"], st["delay"] = [], None, None
                                continue
                            self._record(st["pending"], "after", committed)
                            return
                    else:
                        client.sendall(msg)
        except OSError:
            pass
        finally:
            _kill(client, up)
            self.conns.discard(pair)


def _kill(*socks):
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            s.close()
        except OSError:
            pass
