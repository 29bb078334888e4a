"""TCP ports for the processes the tests start on 127.0.0.1 (gateways, replicas, clusters).

A port from bind(port 0) is drawn from the kernel's ephemeral range, which every process on the
machine draws from too: two pytest-xdist workers were handed the same port a few milliseconds
apart, and a gateway of one answered the other's clients. Each worker takes its ports from a
block of its own below that range instead (gw0 10000–10999, gw1 11000–11999, …), in turn, each
checked free by a bind; where the range leaves no room for the block, bind(port 0) as before.
Within one run no two workers share a port; two runs on one machine may, and a gateway given a
port in use exits (http_start_failed): the factories then take another."""

import os
import random
import socket
import threading

BASE, BLOCK = 10000, 1000


def _block():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker[2:]) if worker[2:].isdigit() else 0
    start = BASE + n * BLOCK
    return range(start, start + BLOCK) if start + BLOCK <= low else None


_ports = _block()
# (From a random place in the block: two runs of the suite on one machine start apart.)
_next = random.randrange(BLOCK)
_lock = threading.Lock()


def _bindable(port):
    # SO_REUSEADDR as the gateway's listener has it: a port whose last connections wait in
    # TIME_WAIT is free to it; one a process listens on is not.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port():
    global _next
    if _ports is not None:
        with _lock:
            for _ in range(len(_ports)):
                port = _ports[_next % len(_ports)]
                _next += 1
                if _bindable(port):
                    return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
