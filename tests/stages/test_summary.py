"""A stage's closing figures print as readable lines, not a Python dict."""

from __future__ import annotations

from stages.cli import summary


def test_figures_print_one_per_line_with_nested_names():
    text = summary(
        "extract",
        {"tokens": 1234567, "rate": 40123.456, "time": {"forward_s": 1.5}, "ok": True, "x": None},
    )
    assert text.splitlines() == [
        "[extract]",
        "  tokens          1,234,567",
        "  rate            40,123.5",
        "  time.forward_s  1.5",
        "  ok              true",
        "  x               -",
    ]
    assert "{" not in text
