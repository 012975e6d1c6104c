-- Which merged turns are not where their sample's sequence says, id for id? (None should be:
-- with ids concatenated each turn's prompt was built from the turn before it. A row here means
-- raw data mixed from different runs.) Compares every turn's prompt and output with the sequence
-- at its place; a rendered turn (all_turns_rendered) is a sequence of its own, built from it.
SELECT s.dataset, s.sample_id, s.turn
FROM merged m JOIN samples s ON s.sample_id = m.conversation AND s.turn <= m.last_turn
WHERE NOT m.rendered
  AND (m.ids[1:s.prompt_len] <> s.prompt_ids
       OR m.ids[s.prompt_len + 1:s.prompt_len + s.completion_tokens] <> s.output_ids)
ORDER BY s.dataset, s.sample_id, s.turn
LIMIT 5
