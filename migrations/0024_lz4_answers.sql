-- A streamed answer's record (an LLM stream is tens of kilobytes to megabytes) and a multipart
-- upload are compressed when they are stored out of line. pglz, the default, cost ~50 µs to
-- compress a 31 KB chat record where lz4 costs ~15 µs, and it was the first of PostgreSQL's
-- own functions in the live-stream bench (issue 25). Values already stored keep their method;
-- a server built without lz4 keeps pglz (the migration still applies). On Citus the column's
-- method goes to every shard, distributed before or after.
DO $$
BEGIN
    ALTER TABLE operations ALTER COLUMN resp_body SET COMPRESSION lz4,
                           ALTER COLUMN req_body SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'lz4 is not built into this server: answers stay compressed with pglz';
END
$$;
