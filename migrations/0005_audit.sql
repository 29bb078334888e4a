-- Paths to a second paid create and to lost results closed after the outside audit (issue 10).

ALTER TABLE operations
    -- The last time an attempt of this operation was ambiguous (a send without a definite
    -- answer, or a lease that expired while sending). Once set, the operation can never end
    -- `failed` by an exhausted budget, and absence is concluded only a grace period after it.
    ADD COLUMN ambiguous_at  timestamptz,
    -- A task id named by a verified webhook that carried this operation's client reference
    -- while it was unknown: the reconciler reads that task and adopts it.
    ADD COLUMN webhook_hint  text;

-- Rows that were ambiguous before this column existed.
UPDATE operations SET ambiguous_at = coalesce(first_sent_at, updated_at)
 WHERE state IN ('unknown', 'review');
