-- Did the target's reasoning survive? Share of replies that close reasoning, and with it empty.
SELECT dataset,
       count(*) AS samples,
       avg((reasoning_open OR reasoning_tokens IS NOT NULL)::INTEGER) AS reasoning_opened_share,
       avg((reasoning_tokens IS NOT NULL)::INTEGER) AS reasoning_closed_share,
       count(*) FILTER (WHERE reasoning_tokens = 0) / count(*) AS empty_reasoning_share
FROM samples
WHERE finish_reason <> 'abort'
GROUP BY dataset
ORDER BY dataset
