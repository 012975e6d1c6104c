-- How are the lengths spread? Equal-width buckets per dataset and measure, for plots.
WITH lengths AS (
    UNPIVOT (SELECT dataset, prompt_len, reasoning_tokens, answer_tokens, total_tokens
             FROM samples WHERE finish_reason <> 'abort')
    ON prompt_len AS prompt, reasoning_tokens AS reasoning, answer_tokens AS answer,
       total_tokens AS total
    INTO NAME measure VALUE tokens
),
bounds AS (
    SELECT dataset, measure, min(tokens) AS lo,
           greatest((max(tokens) - min(tokens)) / $buckets, 1) AS width
    FROM lengths GROUP BY dataset, measure
)
SELECT l.dataset, l.measure,
       least(floor((l.tokens - b.lo) / b.width), $buckets - 1)::INTEGER AS bucket,
       (b.lo + least(floor((l.tokens - b.lo) / b.width), $buckets - 1) * b.width)::INTEGER
           AS bucket_start,
       count(*) AS samples
FROM lengths l JOIN bounds b USING (dataset, measure)
GROUP BY ALL
ORDER BY l.dataset, l.measure, bucket
