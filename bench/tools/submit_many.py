#!/usr/bin/env python3
"""Submits N generation requests with new Idempotency-Keys and no wait (each answered 202 as
soon as its intent is recorded), from CONCURRENCY keep-alive connections, and prints one JSON
line: how many were submitted, the statuses, and how long it took.

usage: submit_many.py URL TOKEN N KEY_PREFIX [CONCURRENCY]
"""
import http.client
import json
import sys
import threading
import time
import urllib.parse

BODY = json.dumps({"prompt": "a lighthouse at dawn, watercolour", "n": 1,
                   "size": "1024x1024"}).encode()


def main():
    url, token, n, prefix = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    conc = int(sys.argv[5]) if len(sys.argv) > 5 else 64
    u = urllib.parse.urlsplit(url)
    lock = threading.Lock()
    state = {"next": 0, "statuses": {}}

    def take():
        with lock:
            i = state["next"]
            if i >= n:
                return None
            state["next"] = i + 1
            return i

    def worker():
        conn = None
        while True:
            i = take()
            if i is None:
                break
            status = "error"
            for _ in range(3):  # a dropped keep-alive connection: the same key again
                try:
                    if conn is None:
                        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
                    conn.request("POST", u.path, BODY, {
                        "Authorization": f"Bearer {token}", "Content-Type": "application/json",
                        "Idempotency-Key": f"{prefix}-{i}",
                        # a synchronous route waits for the provider by default: not here
                        "Prefer": "respond-async"})
                    r = conn.getresponse()
                    r.read()
                    status = str(r.status)
                    break
                except (OSError, http.client.HTTPException):
                    conn = None
            with lock:
                state["statuses"][status] = state["statuses"].get(status, 0) + 1
        if conn:
            conn.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"submitted": n, "statuses": state["statuses"],
                      "seconds": round(time.monotonic() - t0, 2)}))


if __name__ == "__main__":
    main()
