-- Which merged turns are not where their sample's sequence says, id for id? (None should be:
-- with ids concatenated each turn's prompt was built from the turn before it. A row here means
-- raw data mixed from different runs.) Compares every turn before a sequence's last with the
-- sequence's ids (its last turn's prompt and output) at its place; the last turn is the sequence
-- itself, and a rendered turn (all_turns_rendered) is a sequence of its own, built from it.
WITH earlier AS (
    SELECT s.dataset, s.sample_id, s.turn, s.prompt_len, s.completion_tokens,
           s.filename, s.file_row_number, m.source_file, m.source_row
    FROM plan m JOIN samples s ON s.sample_id = m.conversation AND s.turn < m.last_turn
    WHERE NOT m.rendered
)
SELECT e.dataset, e.sample_id, e.turn
FROM earlier e
JOIN raw_ids t ON t.filename = e.filename AND t.file_row_number = e.file_row_number
JOIN raw_ids q ON q.filename = e.source_file AND q.file_row_number = e.source_row
WHERE list_concat(q.prompt_ids, q.output_ids)[1:e.prompt_len] <> t.prompt_ids
   OR list_concat(q.prompt_ids, q.output_ids)[e.prompt_len + 1:e.prompt_len + e.completion_tokens]
      <> t.output_ids
ORDER BY e.dataset, e.sample_id, e.turn
LIMIT 5
