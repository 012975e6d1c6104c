-- How many turns did the target write per sample (more than one when it rewrote every turn)?
SELECT dataset,
       count(*) AS turns,
       round(count(*) / count(DISTINCT sample_id), 3) AS turns_per_sample,
       max(turn) AS max_turns
FROM samples
GROUP BY dataset
ORDER BY dataset
