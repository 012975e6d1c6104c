-- Which replies never closed their reasoning (cut at max_new_tokens, or the end token lost)?
SELECT dataset, sample_id, turn, finish_reason, reasoning_open, completion_tokens,
       left(regexp_replace(output_text, '\s+', ' ', 'g'), 60) AS output_start
FROM samples
WHERE finish_reason <> 'abort' AND reasoning_tokens IS NULL
ORDER BY dataset, sample_id, turn
LIMIT $limit
