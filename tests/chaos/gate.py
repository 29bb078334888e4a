"""A provider address whose connect() hangs until the test opens the gate (L1, stall before send).

The listener has a backlog of 0 and one dummy connection sitting in its accept queue, so the
kernel drops every further SYN: a client's connect() waits for its SYN retransmission. Opening the
gate accepts the dummy; the next retransmission completes the handshake in the kernel, whether
the connecting process runs or is stopped. Every connection the gate later accepts is read for
a while: the bytes a client sent through it are what the test checks (a stale worker must send
none)."""

import socket
import time


class Gate:
    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.dummy = socket.create_connection(("127.0.0.1", self.port))
        self.opened = False

    def open(self):
        """Accepts the dummy: the accept queue has room for one connection again."""
        if not self.opened:
            c, _ = self.sock.accept()
            c.close()
            self.opened = True

    def drain(self, wait=1.0, read_for=1.0):
        """Accepts whatever is queued (for up to `wait` s) and reads each connection for up to
        `read_for` s. Returns the number of bytes received in all."""
        total = 0
        self.sock.settimeout(0.1)
        deadline = time.monotonic() + wait
        conns = []
        while time.monotonic() < deadline:
            try:
                c, _ = self.sock.accept()
                conns.append(c)
            except (socket.timeout, BlockingIOError):
                pass
        end = time.monotonic() + read_for
        for c in conns:
            c.settimeout(0.1)
            while time.monotonic() < end:
                try:
                    data = c.recv(65536)
                except (socket.timeout, BlockingIOError):
                    continue
                except OSError:
                    break
                if not data:
                    break
                total += len(data)
            c.close()
        self.sock.settimeout(None)
        return total

    def rearm(self):
        """Fills the accept queue again (after drain): the next connect() hangs."""
        self.dummy.close()
        self.dummy = socket.create_connection(("127.0.0.1", self.port))
        self.opened = False

    def close(self):
        for s in (self.dummy, self.sock):
            try:
                s.close()
            except OSError:
                pass
