-- Which samples go into training, in which order and split?
-- Keeps completed generations, marks prompts seen before (normalised text, across datasets),
-- joins prompt and output ids, and orders by a seeded hash so the shuffle is deterministic.
WITH ranked AS (
    SELECT *, row_number() OVER (PARTITION BY prompt_key ORDER BY sample_id) AS copy_rank
    FROM samples
    WHERE finish_reason <> 'abort' AND completion_tokens > 0
)
SELECT
    sample_id,
    dataset,
    list_concat(prompt_ids, output_ids)[1:$max_length] AS input_ids,
    prompt_len AS loss_start,
    least(total_tokens, $max_length)::INTEGER AS length,
    total_tokens > $max_length AS truncated,
    CASE WHEN ('0x' || md5('split:' || $seed || ':' || sample_id)[1:8])::UBIGINT
              < $eval_fraction * 4294967296 THEN 'eval' ELSE 'train' END AS split,
    copy_rank > 1 AS duplicate
FROM ranked
WHERE prompt_len < $max_length
ORDER BY md5('order:' || $seed || ':' || sample_id)
