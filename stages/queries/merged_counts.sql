-- What did each dataset give each split? Samples (training sequences: one per conversation, or
-- one per turn with all_turns_rendered) and the conversations they come from, tokens, supervised
-- tokens and turns; prompts dropped as duplicates; samples cut at max_length, or ended at an
-- earlier turn to fit it.
SELECT dataset, split,
       count(*) FILTER (WHERE NOT duplicate) AS samples,
       count(DISTINCT conversation) FILTER (WHERE NOT duplicate) AS conversations,
       count(*) FILTER (WHERE duplicate) AS duplicates,
       sum(length) FILTER (WHERE NOT duplicate) AS tokens,
       sum(list_sum(list_transform(loss_spans, lambda s: s[2] - s[1])))
           FILTER (WHERE NOT duplicate) AS supervised_tokens,
       sum(len(loss_spans)) FILTER (WHERE NOT duplicate) AS turns,
       count(*) FILTER (WHERE truncated AND NOT duplicate) AS truncated,
       count(*) FILTER (WHERE shortened AND NOT duplicate) AS shortened
FROM plan
GROUP BY ALL
ORDER BY ALL
