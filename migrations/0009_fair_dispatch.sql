-- Fair dispatch across tenants (issue 14 §2): the claim serves the tenant whose turn is oldest,
-- so one tenant's queue of thousands does not delay another's first job by more than a few
-- claims. A tenant's turn is the last time one of its operations was claimed.
CREATE TABLE dispatch_turns (
    tenant_id  bigint PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    served_at  timestamptz NOT NULL
);

-- The tenants with prepared work (a loose index scan over it), and each one's most overdue row.
CREATE INDEX operations_due_by_tenant ON operations (tenant_id, next_attempt_at)
    WHERE state = 'prepared';
