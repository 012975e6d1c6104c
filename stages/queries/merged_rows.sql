-- The merged rows of one split with their token ids (input_ids: the source row's prompt and
-- output ids, cut at max_length), duplicates left out, unordered (`position` orders them). The
-- ids are read from the raw parts by file and row, joined to the plan (merge.sql), so nothing
-- but the rows being written holds ids. The plan's spans and lengths come from the source row's
-- prompt_len and completion_tokens, the lengths of its ids as generate writes them: a row where
-- they are not fails the merge naming it.
SELECT m.*,
       CASE WHEN len(r.prompt_ids) = m.source_prompt_len
                 AND len(r.output_ids) = m.ids_len - m.source_prompt_len
            THEN list_concat(r.prompt_ids, r.output_ids)[1:$max_length]
            ELSE error(format('raw row {} (row {} of {}): its prompt_len and completion_tokens '
                              'are not the lengths of its prompt_ids and output_ids',
                              m.sample_id, m.source_row, m.source_file)) END AS input_ids
FROM plan m
JOIN raw_ids r ON r.filename = m.source_file AND r.file_row_number = m.source_row
WHERE NOT m.duplicate AND m.split = $split
