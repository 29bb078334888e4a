-- Output archival (issue 13 §1): completed is not archived. Every output of a completed
-- operation gets one row here, planned by an archive worker from the stored result; archive
-- workers claim the rows (FOR UPDATE SKIP LOCKED, a lease and a fencing token, as the poller
-- does) and copy the bytes into the content-addressed store before the provider's URL expires.

-- When the outputs of a completed operation were planned (rows inserted below); NULL: not yet.
ALTER TABLE operations ADD COLUMN archive_planned_at timestamptz;

CREATE INDEX operations_archive_unplanned ON operations (finished_at)
    WHERE state = 'completed' AND archive_planned_at IS NULL;

CREATE TABLE archive_outputs (
    tenant_id      bigint NOT NULL,
    op_id          text NOT NULL,
    n              integer NOT NULL,             -- the output's index in the result, from 0
    provider       text NOT NULL,
    kind           text NOT NULL CHECK (kind IN ('url', 'b64', 'endpoint')),
    source_url     text,                         -- url and endpoint kinds
    credential     text,                         -- endpoint kind: the variable holding the secret
    expires_at     timestamptz,                  -- when the provider's URL stops working
    state          text NOT NULL DEFAULT 'pending'
                   CHECK (state IN ('pending', 'archived', 'failed', 'expired')),
    attempts       integer NOT NULL DEFAULT 0,
    last_error     text,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_owner    text,
    lease_version  bigint NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    sha256         text,                         -- hex, also the object's name in the store
    bytes          bigint,
    content_type   text,
    backend        text,                         -- 'local' or 's3': where the object was put
    created_at     timestamptz NOT NULL DEFAULT now(),
    archived_at    timestamptz,
    PRIMARY KEY (tenant_id, op_id, n),
    FOREIGN KEY (tenant_id, op_id) REFERENCES operations (tenant_id, id) ON DELETE CASCADE
);

-- The workers' claim: pending rows, most urgent expiry first.
CREATE INDEX archive_outputs_due ON archive_outputs (next_attempt_at) WHERE state = 'pending';
-- Objects still referenced by some output (a janitor removes the others).
CREATE INDEX archive_outputs_sha256 ON archive_outputs (sha256) WHERE sha256 IS NOT NULL;
