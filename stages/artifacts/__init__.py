"""The pipeline's artifacts, one owner module each: what their files are called, their columns,
and how they are written and read. Stages and queries go through these, never around them.

prompts (prep) -> raw (generate) -> merged (merge) -> hidden (extract)."""
