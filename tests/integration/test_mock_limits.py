"""The mock provider at its connection limit (--threads): connections past it are closed at
once, and the mock goes on serving when the held ones end. (libmicrohttpd 0.9.75 never served
again once MHD_add_connection met its own limit, which the full-size slow campaign reached: every
later create and poll failed with curl 52.)"""
import json
import socket
import subprocess
import time

from conftest import MOCK_BIN, Http, free_port, wait_for_line


def test_mock_refuses_past_its_limit_and_recovers():
    port = free_port()
    proc = subprocess.Popen([MOCK_BIN, "--listen", f"127.0.0.1:{port}", "--threads", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    held = []
    try:
        wait_for_line(proc, "listening")
        http = Http(f"http://127.0.0.1:{port}")
        # No request before the held ones: the mock counts a connection until libmicrohttpd
        # reports it closed, which on a loaded machine comes after the next ones arrive.
        body = json.dumps({"prompt": "x", "_mock": {"fault": "hang"}}).encode()
        for _ in range(8):  # twice the limit, each held open by a hanging create
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            held.append(s)
        time.sleep(0.5)
        closed = 0
        for s in held:  # those past the limit were closed at once; the others are held
            s.settimeout(0.2)
            try:
                closed += s.recv(1) == b""
            except ConnectionResetError:
                closed += 1
            except socket.timeout:
                pass
        assert closed == 4, closed
        for s in held:
            s.close()
        held.clear()
        deadline = time.monotonic() + 10
        status = None
        while time.monotonic() < deadline:
            try:
                status = http.request("GET", "/_health").status
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        assert status == 200
        # Exactly the limit's worth of creates reached the provider.
        assert len(http.request("GET", "/_ledger").json()["creates"]) == 4
    finally:
        for s in held:
            s.close()
        proc.terminate()
        proc.wait(timeout=10)
