-- How often does each token id occur in the supervised (assistant) spans of the train split?
SELECT token, count(*) AS n
FROM (SELECT unnest(input_ids[span[1] + 1:span[2]]) AS token
      FROM (SELECT input_ids, unnest(loss_spans) AS span FROM read_parquet($train_file)))
GROUP BY token
