#!/usr/bin/env python3
"""A sequential keep-alive client for the instruction counts: N requests, one after the other, on
one connection, so that the work measured is exactly N requests.

    seq_client.py HOST PORT MODE N PATH TOKEN KEYPREFIX [PREFER]

MODE: unique (a new Idempotency-Key per request: KEYPREFIX-i), reuse (KEYPREFIX every time), or
get (GET PATH). Prints "done N CODES SECONDS", CODES as status:count pairs.
"""
import http.client
import sys
import time

BODY = b'{"prompt":"a lighthouse at dawn, watercolour","n":1,"size":"1024x1024"}'


def main():
    host, port, mode, n, path, token, prefix = sys.argv[1:8]
    port, n = int(port), int(n)
    prefer = sys.argv[8] if len(sys.argv) > 8 else ""
    conn = http.client.HTTPConnection(host, port, timeout=120)
    codes = {}
    t0 = time.monotonic()
    for i in range(n):
        headers = {"Authorization": "Bearer " + token}
        if mode == "get":
            conn.request("GET", path, headers=headers)
        else:
            headers["Content-Type"] = "application/json"
            headers["Idempotency-Key"] = prefix if mode == "reuse" else f"{prefix}-{i}"
            if prefer:
                headers["Prefer"] = prefer
            conn.request("POST", path, body=BODY, headers=headers)
        r = conn.getresponse()
        r.read()
        codes[r.status] = codes.get(r.status, 0) + 1
    secs = time.monotonic() - t0
    print("done %d %s %.3f" % (n, ",".join(f"{k}:{v}" for k, v in sorted(codes.items())), secs),
          flush=True)


if __name__ == "__main__":
    main()
