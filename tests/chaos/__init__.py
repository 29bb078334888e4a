"""idemgate's Jepsen-style fault harness.

- client.py   the client driver: intents with a unique (tenant, key), retried with the same key
              on timeouts, 5xx and connection errors, bounded in count and time; each operation
              ends ok / failed / unknown from the client's point of view.
- checker.py  the checker: a bounded drain, then lost / duplicates / unexpected / unknown /
              review from the database and the mock's ledger; one JSON summary line.
- replicas.py gateway replicas that can be killed, stopped, restarted on the same port.
- cluster.py  a PostgreSQL cluster of the test's own (for D1/D2 and lifecycle), SQL helper.
- pgproxy.py  a Unix-socket PostgreSQL protocol proxy that loses connections at chosen
              statements, before the statement or after its COMMIT (D2).
- gate.py     a listener whose full accept queue holds a connect() open (L1, stall before send).
- report.py   collects summary lines for pytest's terminal summary and build-test/.

Import it from a test with `sys.path.insert(0, <repo>/tests)` then `import chaos`.
"""
