"""Gateway replicas that a scenario kills (SIGKILL), stalls (SIGSTOP/SIGCONT) and restarts on the
same port, on top of the integration tests' gateway_factory (which stops whatever is still
running at the end of the test and asserts a clean exit). Every signal goes to a PID this
harness started."""

import json
import os
import signal
import threading
import time


class Replica:
    def __init__(self, name, port, settings, env, first_env):
        self.name = name
        self.port = port
        self.settings = settings   # the configuration of every (re)start
        self.env = env             # the environment of every (re)start
        self.first_env = first_env  # added to the first start only (e.g. IDEMGATE_CRASH)
        self.gw = None
        self.starts = 0
        self.kills = 0            # SIGKILLs sent by the harness
        self.crashes = 0          # deaths by SIGKILL the harness did not send (crash points)
        self.logs = []

    @property
    def proc(self):
        return self.gw.proc if self.gw else None

    def alive(self):
        return self.gw is not None and self.gw.proc.poll() is None

    def log(self):
        return "".join(open(p).read() for p in self.logs if os.path.exists(p))


class Replicas:
    def __init__(self, factory, free_port):
        self.factory = factory
        self.free_port = free_port
        self.replicas = {}
        self.lock = threading.RLock()
        self._sup = None
        self._sup_stop = threading.Event()

    def start(self, name, env=None, first_env=None, **settings):
        """Starts replica `name`; the first call fixes its port, settings and environment, a
        later call (a restart) reuses them, plus `first_env` for that start only."""
        with self.lock:
            r = self.replicas.get(name)
            if r is None:
                r = Replica(name, self.free_port(), dict(settings), dict(env or {}),
                            dict(first_env or {}))
                self.replicas[name] = r
                extra = r.first_env
            else:
                extra = dict(first_env or {})
            s = dict(r.settings)
            s.setdefault("instance_id", f"{name}")
            s["env"] = dict(r.env, **extra)
            for left in range(2, -1, -1):
                s["listen"] = f"127.0.0.1:{r.port}"
                try:
                    r.gw = self.factory(**s)
                    break
                except RuntimeError as e:
                    # A first start whose port another process took meanwhile (the gateway
                    # refuses an address in use): another port. A restart keeps its own.
                    # (Not when its settings name the port, as a public_url does.)
                    if r.starts or not left or "http_start_failed" not in str(e) or \
                            str(r.port) in json.dumps({k: v for k, v in s.items()
                                                       if k != "listen"}):
                        raise
                    r.port = self.free_port()
            r.starts += 1
            r.logs.append(r.gw.log_path)
            return r

    def restart(self, name, first_env=None):
        r = self.replicas[name]
        assert not r.alive(), f"{name} is still running"
        return self.start(name, first_env=first_env)

    def kill(self, name):
        with self.lock:
            r = self.replicas[name]
            if r.alive():
                r.gw.proc.send_signal(signal.SIGKILL)
                r.gw.proc.wait(timeout=10)
                r.kills += 1
            return r

    def stop(self, name, timeout=30):
        """SIGTERM and wait; returns the exit status (None: it did not exit in time)."""
        r = self.replicas[name]
        if not r.alive():
            return r.gw.proc.returncode if r.gw else None
        r.gw.proc.send_signal(signal.SIGTERM)
        try:
            return r.gw.proc.wait(timeout=timeout)
        except Exception:
            return None

    def sigstop(self, name):
        self.replicas[name].gw.proc.send_signal(signal.SIGSTOP)

    def sigcont(self, name):
        self.replicas[name].gw.proc.send_signal(signal.SIGCONT)

    def ports(self, alive_only=False):
        with self.lock:
            return [r.port for r in self.replicas.values() if r.alive() or not alive_only]

    def __getitem__(self, name):
        return self.replicas[name]

    def supervise(self, restart_delay=0.2, interval=0.05):
        """Restarts any replica that died (without its first environment: a crash point fires
        once); counts crash-point deaths. Runs until stop_supervising()."""
        def loop():
            while not self._sup_stop.is_set():
                with self.lock:
                    dead = [r for r in self.replicas.values()
                            if r.gw is not None and r.gw.proc.poll() is not None]
                for r in dead:
                    if getattr(r, "_counted", None) is not r.gw:
                        r._counted = r.gw
                        if r.gw.proc.returncode == -signal.SIGKILL and "crash_point" in open(
                                r.gw.log_path).read():
                            r.crashes += 1
                    time.sleep(restart_delay)
                    if self._sup_stop.is_set():
                        break
                    try:
                        self.restart(r.name)
                    except Exception:  # the port may still be held a moment: try again
                        time.sleep(0.2)
                self._sup_stop.wait(interval)
        self._sup_stop.clear()
        self._sup = threading.Thread(target=loop, daemon=True)
        self._sup.start()

    def stop_supervising(self):
        self._sup_stop.set()
        if self._sup:
            self._sup.join(timeout=30)
            self._sup = None

    def stop_all(self, timeout=30):
        """SIGTERM to every live replica; returns {name: exit status}."""
        self.stop_supervising()
        return {name: self.stop(name, timeout) for name in list(self.replicas)
                if self.replicas[name].alive()}
