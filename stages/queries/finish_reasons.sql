-- How did generations end? Shares of stop, length (truncated) and abort (failed), per dataset.
SELECT dataset,
       count(*) AS samples,
       avg((finish_reason = 'stop')::INTEGER) AS stop_share,
       avg((finish_reason = 'length')::INTEGER) AS truncated_share,
       avg((finish_reason = 'abort')::INTEGER) AS failed_share,
       count(*) FILTER (WHERE finish_reason = 'abort') AS failed
FROM samples
GROUP BY dataset
ORDER BY dataset
