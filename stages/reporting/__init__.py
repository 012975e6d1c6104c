"""What people read about a run: the HTML report (inline SVG charts, no network), the compact
metrics DVC compares, the model card, and the text tables of the DuckDB command.

Plain values in, text out: nothing here reads params, files or artifacts (the report stage does),
so every piece is tested alone.
"""
