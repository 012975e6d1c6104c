-- The view the merge and every quality question read: one row per generated turn (a sample's
-- only one in last_turn mode; the first copy when an interrupted compaction left two), with its
-- total length, a prompt key (normalised text of messages and tools) for dedupe, and its place
-- in the parts (filename, file_row_number).
CREATE OR REPLACE TEMP VIEW samples AS
SELECT *,
       prompt_len + completion_tokens AS total_tokens,
       md5(lower(regexp_replace(messages || coalesce(tools, ''), '\s+', ' ', 'g'))) AS prompt_key
FROM read_parquet($raw_files, union_by_name = true, filename = true,
                  file_row_number = true)
QUALIFY row_number() OVER (PARTITION BY sample_id, turn ORDER BY filename) = 1
