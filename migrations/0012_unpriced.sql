-- Unpriced requests under budgets (issue 21 §7). An operation whose request its provider's price
-- table prices with nothing (a model the table does not list, and no fallback_per_output) is
-- marked at intake, so that a regeneration of it — which reserves its parent's estimate — is
-- refused under an amount budget like the intake would be, never let through at a silent 0.
ALTER TABLE operations
    ADD COLUMN unpriced boolean NOT NULL DEFAULT false;
