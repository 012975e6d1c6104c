-- Which samples go into training, in which order and split?
-- Ids concatenated (last_turn, all_turns): one sequence per sample, the ids of its last usable
-- turn, prompt and output, which hold every turn before it, with one loss span [start, end) per
-- turn: its output. A turn is usable when it and the turns before it completed; a sample longer
-- than max_length ends at its last turn that fits (or, when even its first does not, that turn is
-- cut). Rendered (all_turns_rendered, the raw rows' `regenerate`): one sequence per usable turn,
-- its own prompt and output with one loss span, named `<sample_id>#<turn>`; a later turn's prompt
-- is not the earlier sequence, so no turn holds another. Prompts seen before (normalised text,
-- across datasets) mark every sequence of the later sample; a sample's sequences share its split
-- (seeded hash of the sample id), and a seeded hash of the sequence id orders the rows
-- (`position`). No token id is read here: a sequence's ids are its source row's (`source_file`,
-- `source_row`: the raw row of its last turn, or of its rendered turn), whose prompt_len and
-- completion_tokens give the lengths; merged_rows.sql fetches them, so this plan stays small.
WITH usable AS (
    SELECT sample_id, dataset, turn, prompt_key, prompt_len, completion_tokens, total_tokens,
           filename, file_row_number,
           coalesce(regenerate = 'all_turns_rendered', false) AS rendered,
           bool_and(finish_reason <> 'abort' AND completion_tokens > 0)
                  OVER (PARTITION BY sample_id ORDER BY turn) AS completed
    FROM samples
),
fits AS (
    SELECT sample_id, count(*) AS turns,
           coalesce(max(turn) FILTER (WHERE total_tokens <= $max_length), 1) AS last_turn
    FROM usable
    WHERE completed AND NOT rendered
    GROUP BY sample_id
),
conversations AS (
    SELECT sample_id AS sequence_id,
           sample_id,
           any_value(dataset) AS dataset,
           any_value(prompt_key) AS prompt_key,
           false AS rendered,
           any_value(f.turns) AS turns,
           any_value(f.last_turn) AS last_turn,
           arg_min(prompt_len, turn) AS first_prompt_len,
           arg_max(filename, turn) AS source_file,
           arg_max(file_row_number, turn) AS source_row,
           arg_max(prompt_len, turn) AS source_prompt_len,
           arg_max(total_tokens, turn) AS ids_len,
           list([prompt_len, prompt_len + completion_tokens] ORDER BY turn) AS spans
    FROM usable JOIN fits f USING (sample_id)
    WHERE completed AND turn <= f.last_turn
    GROUP BY sample_id
),
rendered_turns AS (
    SELECT sample_id || '#' || turn AS sequence_id,
           sample_id,
           dataset,
           prompt_key,
           true AS rendered,
           1 AS turns,
           turn AS last_turn,
           prompt_len AS first_prompt_len,
           filename AS source_file,
           file_row_number AS source_row,
           prompt_len AS source_prompt_len,
           total_tokens AS ids_len,
           [[prompt_len, prompt_len + completion_tokens]] AS spans
    FROM usable
    WHERE completed AND rendered
),
sequences AS (
    SELECT * FROM conversations
    UNION ALL BY NAME
    SELECT * FROM rendered_turns
),
ranked AS (
    SELECT *, min(sample_id) OVER (PARTITION BY prompt_key) <> sample_id AS duplicate
    FROM sequences
)
SELECT
    sequence_id AS sample_id,
    sample_id AS conversation,
    dataset,
    rendered,
    last_turn,
    source_file,
    source_row,
    source_prompt_len,
    ids_len,
    list_filter(list_transform(spans, lambda s: [s[1], least(s[2], $max_length)]),
                lambda s: s[1] < s[2]) AS loss_spans,
    least(ids_len, $max_length)::INTEGER AS length,
    ids_len > $max_length AS truncated,
    NOT rendered AND last_turn < turns AS shortened,
    CASE WHEN ('0x' || md5('split:' || $seed || ':' || sample_id)[1:8])::UBIGINT
              < $eval_fraction * 4294967296 THEN 'eval' ELSE 'train' END AS split,
    duplicate,
    row_number() OVER (ORDER BY md5('order:' || $seed || ':' || sequence_id)) AS position
FROM ranked
WHERE first_prompt_len < $max_length
ORDER BY position
