"""Query results for a terminal (an aligned table), for spreadsheets (CSV) and for programs
(JSON lines are not needed: one JSON array of objects)."""

from __future__ import annotations

import csv
import datetime
import io
import json
from collections.abc import Sequence
from decimal import Decimal


def plain(value: object) -> object:
    """JSON-friendly: Decimal to int or float, dates to ISO text, lists and maps recursively."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def _shown(value: object, width: int) -> str:
    value = plain(value)
    if value is None:
        text = "NULL"
    elif isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, float):
        text = f"{value:.4f}".rstrip("0").rstrip(".") if abs(value) < 1e6 else f"{value:.4g}"
    elif isinstance(value, list):
        head = ", ".join(str(v) for v in value[:4])
        text = f"[{head}{', …' if len(value) > 4 else ''}] ({len(value)})"
    else:
        text = str(value).replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def text_table(columns: Sequence[str], rows: Sequence[Sequence], max_width: int = 64) -> str:
    """Aligned columns, numbers right-aligned, long cells cut; a last line counts the rows."""
    cells = [[_shown(v, max_width) for v in row] for row in rows]
    numeric = [
        all(isinstance(plain(r[i]), (int, float)) or r[i] is None for r in rows) and bool(rows)
        for i in range(len(columns))
    ]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)
        ).rstrip()

    out = [line(columns), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    out.append(f"({len(rows)} row{'' if len(rows) == 1 else 's'})")
    return "\n".join(out)


def csv_text(columns: Sequence[str], rows: Sequence[Sequence]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(
            [json.dumps(v) if isinstance(v, (list, dict)) else v for v in map(plain, row)]
        )
    return buf.getvalue()


def json_text(columns: Sequence[str], rows: Sequence[Sequence]) -> str:
    return json.dumps([dict(zip(columns, map(plain, row))) for row in rows], indent=1)
