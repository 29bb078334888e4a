-- No trigger writes another table (issue 23 §3): on a sharded database a trigger runs on the
-- shard, where a statement on another distributed or reference table is refused ("cannot execute
-- a distributed query from a query on a shard").
--
-- The unpark trigger moved into the gateway: after a create's result that commits a remote id,
-- it takes the parked webhook for that id, if any, and polls at once (lease.c, unpark).
DROP TRIGGER IF EXISTS operations_unpark ON operations;
DROP FUNCTION IF EXISTS idemgate_unpark();
