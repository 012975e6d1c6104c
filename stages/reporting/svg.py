"""Charts as inline SVG text: grouped or stacked bars and lines, with axes, ticks, a legend and a
native tooltip (`<title>`) on every mark.

Written here, not drawn by a plotting library or a script from a CDN, so the report is one file
that opens from disk with no network and no JavaScript, renders the same in every browser, and
adds no dependency to the pipeline. Every mark carries class `mark`; the browser test checks
that each chart drew some.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

PALETTE = ("#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#9c6b4e")
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 44, 46
# The charts' text (the page's CSS sets svg.chart to 11px) and the width a character can take in
# it: the widest digits and lowercase letters of common sans-serif fonts are about 0.6 em. SVG
# text is laid out by nobody but us, so labels are spaced by this estimate.
FONT_PX = 11
CHAR_PX = 0.62 * FONT_PX
LABEL_GAP_PX = 8  # the least space between two axis labels


def text_width(text: str) -> float:
    """About how wide `text` is drawn at FONT_PX."""
    return len(text) * CHAR_PX


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (about `count` of them)."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    value = start
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    if ticks[-1] < hi:
        ticks.append(round(value, 10))
    return ticks


def number(value: float | None) -> str:
    """A compact label: 12,345 / 0.875 / 1.2e-05."""
    if value is None:
        return "-"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1e-3:
        return f"{value:.3g}"
    return f"{value:.2g}"


def _open(title: str, width: int, height: int, name: str) -> list[str]:
    return [
        f'<svg class="chart" data-chart="{escape(name)}" role="img" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}">',
        f"<title>{escape(title)}</title>",
        f'<text class="chart-title" x="{LEFT}" y="15">{escape(title)}</text>',
    ]


def _axes(
    width: int,
    height: int,
    ticks: list[float],
    y_of,
    x_label: str,
    y_label: str,
) -> list[str]:
    out = []
    for t in ticks:
        y = y_of(t)
        out.append(
            f'<line class="grid" x1="{LEFT}" x2="{width - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{escape(number(t))}</text>"
        )
    bottom = height - BOTTOM
    out.append(f'<line class="axis" x1="{LEFT}" x2="{width - RIGHT}" y1="{bottom}" y2="{bottom}"/>')
    out.append(f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{bottom}"/>')
    out.append(
        f'<text class="label" x="{(LEFT + width - RIGHT) / 2:.0f}" y="{height - 6}" '
        f'text-anchor="middle">{escape(x_label)}</text>'
    )
    out.append(
        f'<text class="label" transform="translate(14 {(TOP + bottom) / 2:.0f}) rotate(-90)" '
        f'text-anchor="middle">{escape(y_label)}</text>'
    )
    return out


def _legend(names: Sequence[str], width: int) -> list[str]:
    """Swatches under the title, left to right."""
    if len(names) < 2:
        return []
    out, x = [], LEFT
    for i, name in enumerate(names):
        out.append(
            f'<rect class="swatch" x="{x}" y="24" width="10" height="10" '
            f'fill="{PALETTE[i % len(PALETTE)]}"/>'
            f'<text class="legend" x="{x + 14}" y="33">{escape(name)}</text>'
        )
        x += round(text_width(name)) + 28
    return out


def bars(
    categories: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    name: str = "bars",
    stacked: bool = False,
    reference: tuple[float, str] | None = None,
    y_max: float | None = None,
    width: int = 460,
    height: int = 240,
    scale: bool = False,
) -> str:
    """Bars per category, one per series side by side (or `stacked`); `reference`: a dashed
    horizontal line (value, label), e.g. the baseline's tau of 1. No two category labels
    overlap: the chart widens until every one fits, or, when the categories are a `scale`
    (histogram buckets, read in order), every how-many-th is labelled."""
    stride, width = _label_stride(categories, width, scale)
    names = list(series)
    values = [[float(v or 0.0) for v in series[n]] for n in names]
    top = _bars_top(values, stacked, reference)
    ticks = nice_ticks(0.0, y_max if y_max is not None else top or 1.0)
    bottom = height - BOTTOM

    def y_of(v: float) -> float:
        return bottom - (bottom - TOP) * v / ticks[-1]

    out = _open(title, width, height, name) + _axes(width, height, ticks, y_of, x_label, y_label)
    slot = (width - LEFT - RIGHT) / max(len(categories), 1)
    group = slot * 0.8
    bar_w = group if stacked else group / max(len(names), 1)
    for c, category in enumerate(categories):
        x0 = LEFT + c * slot + (slot - group) / 2
        base = 0.0
        for s, row in enumerate(values):
            v = row[c] if c < len(row) else 0.0
            x = x0 if stacked else x0 + s * bar_w
            y_top, y_bottom = (y_of(base + v), y_of(base)) if stacked else (y_of(v), bottom)
            tip = f"{category}: {names[s]} {number(series[names[s]][c])}"
            out.append(
                f'<rect class="mark" x="{x:.1f}" y="{y_top:.1f}" width="{max(bar_w - 1, 1):.1f}" '
                f'height="{max(y_bottom - y_top, 0):.1f}" fill="{PALETTE[s % len(PALETTE)]}">'
                f"<title>{escape(tip)}</title></rect>"
            )
            if stacked:
                base += v
        if c % stride == 0:
            out.append(
                f'<text class="tick" x="{x0 + group / 2:.1f}" y="{bottom + 14}" '
                f'text-anchor="middle">{escape(category)}</text>'
            )
    if reference is not None:
        out.append(_reference(y_of(reference[0]), reference[1], width))
    return "\n".join(out + _legend(names, width) + ["</svg>"])


def _label_stride(categories: Sequence[str], width: int, scale: bool) -> tuple[int, int]:
    """(label every how-many-th category, the chart's width) so that labels, centred on their
    slots, keep LABEL_GAP_PX between them: a wider chart for names, fewer labels on a scale."""
    needed = max((text_width(c) for c in categories), default=0.0) + LABEL_GAP_PX
    slot = (width - LEFT - RIGHT) / max(len(categories), 1)
    if slot >= needed:
        return 1, width
    if scale:
        return math.ceil(needed / slot), width
    return 1, math.ceil(LEFT + RIGHT + needed * len(categories))


def _bars_top(
    values: Sequence[Sequence[float]], stacked: bool, reference: tuple[float, str] | None
) -> float:
    """The value the y axis must reach: the tallest bar (or stack), or the reference line when
    that is higher."""
    if stacked:
        top = max((sum(col) for col in zip(*values)), default=0.0)
    else:
        top = max((v for row in values for v in row), default=0.0)
    if reference is not None:
        top = max(top, reference[0])
    return top


def _reference(y: float, label: str, width: int) -> str:
    """A dashed horizontal line across the plot at height `y`, labelled at its right end."""
    return (
        f'<line class="reference" x1="{LEFT}" x2="{width - RIGHT}" y1="{y:.1f}" '
        f'y2="{y:.1f}"><title>{escape(label)}</title></line>'
        f'<text class="legend" x="{width - RIGHT - 4}" y="{y - 4:.1f}" text-anchor="end">'
        f"{escape(label)}</text>"
    )


def lines(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    name: str = "lines",
    points: bool = False,
    width: int = 460,
    height: int = 240,
) -> str:
    """One polyline per series of (x, y) points; `points` marks each one (for sparse series)."""
    names = [n for n in series if series[n]]
    xs = [x for n in names for x, _ in series[n]]
    ys = [y for n in names for _, y in series[n]]
    x_lo, x_hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x_hi <= x_lo:
        x_hi = x_lo + 1
    y_lo = min(0.0, min(ys, default=0.0))
    ticks = nice_ticks(y_lo, max(ys, default=1.0))
    bottom = height - BOTTOM

    def y_of(v: float) -> float:
        return bottom - (bottom - TOP) * (v - ticks[0]) / (ticks[-1] - ticks[0])

    def x_of(v: float) -> float:
        return LEFT + (width - LEFT - RIGHT) * (v - x_lo) / (x_hi - x_lo)

    out = _open(title, width, height, name) + _axes(width, height, ticks, y_of, x_label, y_label)
    for t in nice_ticks(x_lo, x_hi, 6):
        if x_lo <= t <= x_hi:
            out.append(
                f'<text class="tick" x="{x_of(t):.1f}" y="{bottom + 14}" text-anchor="middle">'
                f"{escape(number(t))}</text>"
            )
    for s, n in enumerate(names):
        color = PALETTE[s % len(PALETTE)]
        path = " ".join(f"{x_of(x):.1f},{y_of(y):.1f}" for x, y in series[n])
        out.append(
            f'<polyline class="mark" fill="none" stroke="{color}" stroke-width="1.8" '
            f'points="{path}"><title>{escape(n)}</title></polyline>'
        )
        if points or len(series[n]) == 1:
            for x, y in series[n]:
                out.append(
                    f'<circle class="mark" cx="{x_of(x):.1f}" cy="{y_of(y):.1f}" r="3" '
                    f'fill="{color}"><title>{escape(f"{n} at {number(x)}: {number(y)}")}'
                    f"</title></circle>"
                )
    return "\n".join(out + _legend(names, width) + ["</svg>"])
