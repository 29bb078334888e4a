-- A cancel the provider acknowledged (2xx), kept beside when it was sent (cancel_sent_at, which
-- an answer "for good" sets too: a 404 or 409 to the cancel). At a provider whose cancel
-- deletes the task (profile cancel.deletes: Luma's DELETE), the status read just after the
-- cancel may fail; every later read then answers 404 — the task our cancel deleted — which,
-- without this column, read as an unreadable task for an hour and then `review`.
ALTER TABLE operations ADD COLUMN IF NOT EXISTS cancel_acknowledged boolean NOT NULL DEFAULT false;
