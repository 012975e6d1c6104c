-- How much of each dataset's token budget did generation use?
SELECT b.dataset, b.budget_tokens,
       coalesce(sum(s.completion_tokens), 0) AS generated_tokens,
       round(coalesce(sum(s.completion_tokens), 0) / b.budget_tokens, 4) AS budget_used_share
FROM budgets b LEFT JOIN samples s USING (dataset)
GROUP BY b.dataset, b.budget_tokens
ORDER BY b.dataset
