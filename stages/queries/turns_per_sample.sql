-- How many turns did the target write per sample (more than one with regenerate: all_turns)?
SELECT dataset,
       count(*) AS turns,
       round(count(*) / count(DISTINCT sample_id), 3) AS turns_per_sample,
       max(turn) AS max_turns
FROM samples
GROUP BY dataset
ORDER BY dataset
