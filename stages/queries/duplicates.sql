-- How many prompts repeat another sample's prompt (normalised text), within or across datasets?
WITH ranked AS (
    SELECT dataset, row_number() OVER (PARTITION BY prompt_key ORDER BY sample_id) AS copy_rank
    FROM samples
    WHERE turn = 1
)
SELECT dataset, count(*) AS samples, count(*) FILTER (WHERE copy_rank > 1) AS duplicates
FROM ranked
GROUP BY dataset
ORDER BY dataset
