-- The operations waiting for an operator, along an index of their own (issue 23, "the 10 M-operation
-- history stays flat"): /metrics counts every state work waits in at each scrape, each along its
-- partial index, and `review` had none — a count of it read the whole table. A row is in it only
-- while it waits for a decision: it costs the writes of other states nothing.
CREATE INDEX operations_review ON operations (tenant_id, updated_at) WHERE state = 'review';
