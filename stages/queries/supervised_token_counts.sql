-- How often does each token id occur in the supervised (assistant) part of the train split?
SELECT token, count(*) AS n
FROM (SELECT unnest(input_ids[loss_start + 1:]) AS token FROM read_parquet($train_file))
GROUP BY token
