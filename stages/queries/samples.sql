-- The view the merge and every quality question read: one row per generated sample, with its
-- total length and a prompt key (normalised text of messages and tools) for dedupe.
CREATE OR REPLACE TEMP VIEW samples AS
SELECT *,
       prompt_len + completion_tokens AS total_tokens,
       md5(lower(regexp_replace(messages || coalesce(tools, ''), '\s+', ' ', 'g'))) AS prompt_key
FROM read_parquet($raw_files, union_by_name = true)
