-- idemgate schema, version 1.
-- Every key leads with tenant_id so the schema can later be distributed by tenant (Citus).
-- States are text with a CHECK rather than an enum: adding a state stays a plain migration.

CREATE TABLE tenants (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name          text NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9._-]{1,64}$'),
    token_sha256  text NOT NULL UNIQUE,          -- hex SHA-256 of the bearer token; never the token
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz
);

CREATE TABLE operations (
    tenant_id            bigint NOT NULL REFERENCES tenants (id),
    id                   text NOT NULL,           -- public job id, 'job_' + 26 base32 chars
    idempotency_key      text NOT NULL,
    fingerprint          bytea NOT NULL,          -- SHA-256 over version, provider, route, JCS body
    fingerprint_version  smallint NOT NULL,
    provider             text NOT NULL,
    route                text NOT NULL,
    -- The resolved outbound request, fixed at intake so that resends never re-derive routing.
    -- It never holds the provider secret: only the name of the variable that holds it.
    req_method           text NOT NULL,
    req_url              text NOT NULL,
    req_credential       text NOT NULL,
    req_body             bytea NOT NULL,
    state                text NOT NULL CHECK (state IN ('prepared', 'sending', 'accepted', 'unknown',
                                                        'review', 'completed', 'failed')),
    lease_owner          text,
    lease_version        bigint NOT NULL DEFAULT 0,   -- the fencing token: +1 on every claim
    lease_expires_at     timestamptz,
    next_attempt_at      timestamptz NOT NULL DEFAULT now(),
    transport_attempts   integer NOT NULL DEFAULT 0,
    generation_attempts  integer NOT NULL DEFAULT 1,
    parent_id            text,
    remote_id            text,
    resp_status          integer,
    resp_headers         jsonb,                   -- an allow-list of the provider's headers
    resp_body            bytea,
    last_error           text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    first_sent_at        timestamptz,
    finished_at          timestamptz,
    expires_at           timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, idempotency_key)
);

-- The dispatcher's and the reaper's queues, kept small by being partial.
CREATE INDEX operations_due ON operations (next_attempt_at) WHERE state = 'prepared';
CREATE INDEX operations_leased ON operations (lease_expires_at) WHERE state = 'sending';
CREATE INDEX operations_by_state ON operations (tenant_id, state, created_at);
CREATE INDEX operations_expiry ON operations (expires_at);

-- Every outbound try, whatever became of it (a fenced result is recorded as such).
CREATE TABLE attempts (
    tenant_id      bigint NOT NULL,
    operation_id   text NOT NULL,
    seq            bigint GENERATED ALWAYS AS IDENTITY,
    lease_version  bigint NOT NULL,
    kind           text NOT NULL,              -- 'create', later 'poll', 'reconcile', …
    started_at     timestamptz,
    finished_at    timestamptz NOT NULL DEFAULT now(),
    outcome        text NOT NULL,              -- classifier outcome, or 'lease_expired'
    http_status    integer,
    curl_code      integer,
    bytes_sent     bigint,
    decision       text NOT NULL,              -- the state written, or 'fenced'
    error          text,
    PRIMARY KEY (tenant_id, operation_id, seq),
    FOREIGN KEY (tenant_id, operation_id) REFERENCES operations (tenant_id, id) ON DELETE CASCADE
);

-- Wake-ups. Work that becomes due wakes the dispatchers; a terminal state wakes the clients
-- holding a connection open with `Prefer: wait`. NOTIFY is transactional, so nobody is woken for
-- a row that did not commit.
CREATE FUNCTION idemgate_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'prepared' THEN
        PERFORM pg_notify('idemgate_work', '');
    END IF;
    IF NEW.state IN ('completed', 'failed')
       AND (TG_OP = 'INSERT' OR OLD.state IS DISTINCT FROM NEW.state) THEN
        PERFORM pg_notify('idemgate_done', NEW.id);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER operations_notify
    AFTER INSERT OR UPDATE OF state, next_attempt_at ON operations
    FOR EACH ROW EXECUTE FUNCTION idemgate_notify();
