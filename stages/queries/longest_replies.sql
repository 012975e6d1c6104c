-- Which replies are the longest, how are they split, and how did they end?
SELECT dataset, sample_id, turn, completion_tokens, reasoning_tokens, answer_tokens, tool_calls,
       finish_reason
FROM samples
WHERE finish_reason <> 'abort'
ORDER BY completion_tokens DESC, sample_id, turn
LIMIT $limit
