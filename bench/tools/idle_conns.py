#!/usr/bin/env python3
"""Opens N keep-alive connections to HOST:PORT, sends one request on each and reads its answer,
then holds them all open, idle, until stdin closes (or 60 s pass). Prints "ready N OK" once every
connection has had its answer, so that the caller can read the server's memory with N idle
connections.

    idle_conns.py HOST PORT N PATH TOKEN
"""
import socket
import sys
import time


def read_response(s):
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            return None
        rest += chunk
    return status


def main():
    host, port, n, path, token = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    req = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n\r\n").encode()
    socks, ok = [], 0
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(req)
        if read_response(s) == 200:
            ok += 1
        socks.append(s)
    print(f"ready {len(socks)} {ok}", flush=True)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and sys.stdin.readline():
            pass
    finally:
        for s in socks:
            s.close()


if __name__ == "__main__":
    main()
