-- Lookups measured by `make bench` to grow with the table:
-- the waiters' "which of these jobs are terminal" reads by job id alone;
-- the dispatcher's claim needs fresh statistics on the (tiny) breaker table to keep walking the
-- due index in order instead of sorting every prepared row.
CREATE INDEX operations_id ON operations (id);
ANALYZE provider_breakers;
