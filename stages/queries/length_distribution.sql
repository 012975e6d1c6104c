-- How long are prompts, reasoning, answers and whole samples, per dataset?
WITH lengths AS (
    UNPIVOT (SELECT dataset, prompt_len, reasoning_tokens, answer_tokens, completion_tokens,
                    total_tokens FROM samples WHERE finish_reason <> 'abort')
    ON prompt_len AS prompt, reasoning_tokens AS reasoning, answer_tokens AS answer,
       completion_tokens AS completion, total_tokens AS total
    INTO NAME measure VALUE tokens
)
SELECT dataset, measure, count(*) AS n,
       min(tokens) AS min, quantile_disc(tokens, 0.05) AS p5, quantile_disc(tokens, 0.5) AS p50,
       quantile_disc(tokens, 0.95) AS p95, max(tokens) AS max, round(avg(tokens), 1) AS mean
FROM lengths
GROUP BY dataset, measure
ORDER BY dataset, measure
