-- The settle trigger writes no other table (issue 23 §3). An operation's end still gets its cost
-- here (completed and canceled: the computed cost, else the reservation; failed: 0), on its own
-- row; the tenant's budget row is settled by the statement that ends the operation (finish,
-- cancel, resolve: STORE_SETTLE_CTE in include/idemgate/store.h), in the same commit.
-- `budgeted` keeps meaning "reserved against the tenant's budget at intake": it is no longer
-- cleared, since the statements settle exactly the update that moves a row into a terminal state.
CREATE OR REPLACE FUNCTION idemgate_settle() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.cost_micros := CASE WHEN NEW.state IN ('completed', 'canceled')
                            THEN coalesce(NEW.cost_micros, NEW.reserved_micros) ELSE 0 END;
    RETURN NEW;
END
$$;
