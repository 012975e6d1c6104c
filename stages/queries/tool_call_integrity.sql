-- Are tool calls intact? Share of replies calling a tool, and of replies with a call left open.
SELECT dataset,
       count(*) AS samples,
       avg((tools IS NOT NULL)::INTEGER) AS tools_offered_share,
       avg((tool_calls > 0)::INTEGER) AS tool_call_share,
       sum(tool_calls) AS tool_calls,
       avg((NOT tool_calls_balanced)::INTEGER) AS unbalanced_share
FROM samples
WHERE finish_reason = 'stop'
GROUP BY dataset
ORDER BY dataset
