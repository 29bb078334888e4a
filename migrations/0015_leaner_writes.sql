-- What each write of an operation costs (issue 23 §2). An operation is written three to four
-- times (intake, the send, the result, the archive plan), and a write that changes the state is
-- never a HOT update: every index whose predicate the new row version satisfies gets an entry.
--
-- `operations_due` served the claim's global "most overdue" order, which the fair claim replaced
-- with a per-tenant order (operations_due_by_tenant): one index entry less per new intent.
DROP INDEX IF EXISTS operations_due;

-- The janitor deletes only terminal operations past their expiry: an index over those alone is
-- not touched by the intent nor by the send.
DROP INDEX IF EXISTS operations_expiry;
CREATE INDEX operations_expiry ON operations (expires_at)
    WHERE state IN ('completed', 'failed', 'canceled');

-- Tenants are revoked, never deleted. The foreign key from every operation to its tenant locked
-- the tenant's row (FOR KEY SHARE) in every intent's transaction: concurrent intents of one tenant
-- shared that lock through a MultiXact each time. The tenant is known before any SQL (the
-- gateway's tenant directory reads only live tenants).
ALTER TABLE operations DROP CONSTRAINT IF EXISTS operations_tenant_id_fkey;
