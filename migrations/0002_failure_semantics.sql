-- Failure semantics: retry scheduling, reconciliation, review, tripped credentials, partial
-- results and generation lineage.

ALTER TABLE operations
    -- The provider's idempotency header, fixed at intake with the rest of the resolved request:
    -- when set, every transport retry resends under the same provider key.
    ADD COLUMN req_idem_header     text,
    ADD COLUMN reconcile_strategy  text NOT NULL DEFAULT 'none'
        CHECK (reconcile_strategy IN ('idempotent_resubmit', 'get_by_client_id', 'list_match',
                                      'none')),
    ADD COLUMN outputs_requested   integer,
    ADD COLUMN outputs_received    integer,
    ADD COLUMN usage               jsonb,
    ADD COLUMN resolution          text CHECK (resolution IN ('found', 'absent', 'abandon')),
    ADD COLUMN resolved_by         text,
    ADD COLUMN resolved_at         timestamptz;

-- The reconciler's queue: unknown operations due for another look.
CREATE INDEX operations_unknown_due ON operations (next_attempt_at) WHERE state = 'unknown';
CREATE INDEX operations_parent ON operations (tenant_id, parent_id) WHERE parent_id IS NOT NULL;

-- A provider whose credential was refused (401/402/403). While a row exists, nothing is
-- dispatched to it; its operations wait in `prepared`.
CREATE TABLE provider_breakers (
    provider     text PRIMARY KEY,
    tripped_at   timestamptz NOT NULL DEFAULT now(),
    http_status  integer,
    reason       text NOT NULL,
    job_id       text
);
