-- The view of the raw parts' token ids by place (filename, file_row_number), which the merge
-- joins to its plan: read straight from the Parquet parts, so only the rows asked for are held.
CREATE OR REPLACE TEMP VIEW raw_ids AS
SELECT filename, file_row_number, prompt_ids, output_ids
FROM read_parquet($raw_files, filename = true, file_row_number = true)
