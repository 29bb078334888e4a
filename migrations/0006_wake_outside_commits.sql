-- Wake-ups leave the request commits. The per-row trigger of 0001 ran pg_notify inside
-- every intake and result commit, and PostgreSQL serialises the commits of notifying
-- transactions on one database-wide lock (pgbench on the intake statement: 1 112 tps with it,
-- 3 004 without). The replica that writes a state now wakes its own dispatchers and waiters in
-- process, and one signaller thread per replica tells the others with one coalesced transaction
-- of NOTIFYs every few milliseconds (src/wake.c); a missed signal costs latency only, as
-- dispatchers and waiters also poll.
DROP TRIGGER IF EXISTS operations_notify ON operations;
DROP FUNCTION IF EXISTS idemgate_notify();
