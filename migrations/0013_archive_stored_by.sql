-- Archive across replicas (issue 21 item 13): which replica (instance_id) published each
-- archived object. With a local archive folder per replica the object lives in that replica's
-- folder only; another replica asked for it answers a problem naming it, never a 500. With a
-- shared store (s3, or one volume mounted by every replica) any replica serves it.
ALTER TABLE archive_outputs ADD COLUMN stored_by text;
