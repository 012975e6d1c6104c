-- A few completed turns per dataset, in a seeded order, with their ids: what the report decodes.
SELECT dataset, sample_id, turn, finish_reason, reasoning_open, prompt_ids, output_ids,
       prompt_len, completion_tokens, reasoning_tokens, answer_tokens, tool_calls,
       tool_calls_balanced
FROM samples
WHERE finish_reason <> 'abort'
QUALIFY row_number() OVER (PARTITION BY dataset ORDER BY md5(sample_id || '#' || turn))
        <= $per_dataset
ORDER BY dataset, md5(sample_id || '#' || turn)
