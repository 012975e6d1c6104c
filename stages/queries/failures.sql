-- Which turns failed (finish_reason abort, or an error kept), and with what message?
SELECT dataset, sample_id, turn, finish_reason, error
FROM samples
WHERE finish_reason = 'abort' OR error IS NOT NULL
ORDER BY dataset, sample_id, turn
LIMIT $limit
