-- Per-tenant limits (issue 14 §2), read by every replica every few seconds. NULL: the
-- configuration's default (tenant_requests_per_second, tenant_burst, tenant_wait_connections).
CREATE TABLE tenant_limits (
    tenant_id            bigint PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    requests_per_second  integer CHECK (requests_per_second >= 0),
    burst                integer CHECK (burst >= 0),
    wait_connections     integer CHECK (wait_connections >= 0),
    updated_at           timestamptz NOT NULL DEFAULT now()
);
