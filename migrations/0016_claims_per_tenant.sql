-- Claims are made one tenant at a time (issue 23 §4): each kind of work first reads which
-- tenants have due rows (`… GROUP BY tenant_id`), then claims from one tenant with
-- `tenant_id = $n … FOR UPDATE SKIP LOCKED`. Every due index leads with the tenant, so that both
-- the read (an index-only scan) and each claim (a probe within one tenant) use it; on Citus each
-- statement stays on the tenant's shard.
CREATE INDEX operations_unknown_due_by_tenant ON operations (tenant_id, next_attempt_at)
    WHERE state = 'unknown';
DROP INDEX IF EXISTS operations_unknown_due;

CREATE INDEX operations_accepted_due_by_tenant ON operations (tenant_id, next_attempt_at)
    WHERE state = 'accepted';
DROP INDEX IF EXISTS operations_accepted_due;

CREATE INDEX operations_leased_by_tenant ON operations (tenant_id, lease_expires_at)
    WHERE state = 'sending';
DROP INDEX IF EXISTS operations_leased;

CREATE INDEX archive_outputs_due_by_tenant ON archive_outputs (tenant_id, next_attempt_at)
    WHERE state = 'pending';
DROP INDEX IF EXISTS archive_outputs_due;

-- The order of turns is kept in each replica's memory now (the tenant served last); the table
-- that kept it across replicas was written by every claim.
DROP TABLE IF EXISTS dispatch_turns;
