"""A tiny dependency-free SVG plot: axes with ticks, lines, points, shaded x-bands, a title and a legend. Shared
by stage 1 (roots/select_roots.py: stages.svg) and the report (report/html.py).

    from sftree.svg import Band, Series, svg_plot
    svg = svg_plot(
        [Series([1, 2, 3], [0.5, None, 0.9], kind="line", label="smoothed"),
         Series([2], [0.7], kind="points", marker="diamond", color="#d62728", label="chosen")],
        title="Score", xlabel="eval", ylabel="score",
        bands=[Band(0.5, 1.5, "#1f77b4", "early")])

`None` values are skipped (a line breaks there). A series with more values than the plot is pixels wide is
thinned to what those pixels can show (`decimate`): in each pixel column its lowest and highest value (a line
also keeps the column's first and last, and a break where it has one), so every extreme and every outlier stays
where it was and a 100k-point run still gives a small file; `Series(thin=False)` keeps every value. Text is
escaped; the result is a standalone SVG string.
"""

from __future__ import annotations

import html
import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
MARKERS = ("circle", "square", "diamond", "cross", "ring")


@dataclass
class Series:
    x: Sequence[float]
    y: Sequence[float | None]
    kind: str = "line"  # line | points
    label: str | None = None
    color: str | None = None  # default: next palette colour
    marker: str = "circle"  # for points: circle | square | diamond | cross | ring
    size: float = 3.0  # marker radius in px
    width: float = 1.5  # line width in px
    dash: str | None = None  # e.g. "4 3"
    opacity: float = 1.0
    thin: bool = True  # False: draw every value, however many (e.g. the few chosen roots)


@dataclass
class Band:
    """A shaded vertical strip from x0 to x1 (data units), labelled in the legend."""

    x0: float
    x1: float
    color: str
    label: str | None = None
    opacity: float = 0.12


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About `count` round tick values (steps of 1, 2, 2.5 or 5 times a power of ten) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        return [lo]
    raw = (hi - lo) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    v = first
    while v <= hi + step * 1e-9:
        ticks.append(0.0 if abs(v) < step * 1e-9 else v)
        v = first + len(ticks) * step
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e5 or abs(v) < 1e-3:
        return f"{v:.2g}"
    return f"{v:.6g}"


def _finite_values(y: list[float | None]) -> list[float] | None:
    """`y` itself when it holds no None, NaN or infinity, else None; checked in C where it can be (fsum: exact, so
    finite values never sum to inf; it raises where they would overflow, or for inf - inf)."""
    if None in y:
        return None
    values = cast(list[float], y)  # no None in it: checked above
    try:
        finite = math.isfinite(math.fsum(values))
    except (OverflowError, ValueError):
        finite = all(math.isfinite(v) for v in values)
    return values if finite else None


def _second(pair: tuple[int, float]) -> float:
    return pair[1]


def decimate(
    x: Sequence[float], y: Sequence[float | None], x_lo: float, x_hi: float, columns: int, line: bool
) -> list[int]:
    """Positions of the values to draw when `columns` pixel columns span [x_lo, x_hi]: in each column the first
    lowest and the first highest y, and for a line also the column's first and last value and its first gap
    (None or not finite), so the drawn envelope, every extreme and every line break stay; plus the series' first
    and last value. In x order. A series without gaps costs a few C-level passes per column, not a Python step
    per value."""
    n = len(x)
    if n == 0:
        return []
    x, y = list(x), list(y)
    order = None
    if x != sorted(x):  # unsorted x: work in x order, answer in the series' own
        order = sorted(range(n), key=x.__getitem__)
        x, y = [x[i] for i in order], [y[i] for i in order]
    finite = _finite_values(y)
    step = (x_hi - x_lo) / columns
    bounds = [bisect_left(x, x_lo + c * step) for c in range(1, columns)] + [n]
    keep = {0, n - 1}
    start = 0
    for end in bounds:
        if end > start:
            if finite is not None:
                seg = finite[start:end]
                keep.add(start + seg.index(min(seg)))
                keep.add(start + seg.index(max(seg)))
            else:
                good = [(i, v) for i in range(start, end) if (v := y[i]) is not None and math.isfinite(v)]
                if good:  # (the first lowest and the first highest, as min and max give them)
                    keep.add(min(good, key=_second)[0])
                    keep.add(max(good, key=_second)[0])
                if line and len(good) < end - start:
                    keep.add(
                        next(i for i in range(start, end) if (v := y[i]) is None or not math.isfinite(v))
                    )
            if line:
                keep.update((start, end - 1))
        start = end
    return sorted(keep) if order is None else sorted(order[i] for i in keep)


def _marker(shape: str, cx: float, cy: float, r: float, color: str, opacity: float) -> str:
    a = f'fill="{color}" fill-opacity="{opacity}"'
    if shape == "square":
        return f'<rect x="{cx - r:.1f}" y="{cy - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" {a}/>'
    if shape == "diamond":
        pts = f"{cx:.1f},{cy - r * 1.3:.1f} {cx + r * 1.3:.1f},{cy:.1f} {cx:.1f},{cy + r * 1.3:.1f} {cx - r * 1.3:.1f},{cy:.1f}"
        return f'<polygon points="{pts}" {a}/>'
    if shape == "cross":
        return (
            f'<path d="M{cx - r:.1f},{cy - r:.1f}L{cx + r:.1f},{cy + r:.1f}M{cx - r:.1f},{cy + r:.1f}'
            f'L{cx + r:.1f},{cy - r:.1f}" stroke="{color}" stroke-width="1.6" stroke-opacity="{opacity}"/>'
        )
    if shape == "ring":
        return (
            f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{r:.1f}" fill="none" stroke="{color}" '
            f'stroke-width="1.6" stroke-opacity="{opacity}"/>'
        )
    return f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{r:.1f}" {a}/>'


@dataclass(frozen=True)
class _Frame:
    """The plot area (pixels from the top left) and the data ranges it spans."""

    left: int
    top: int
    pw: int
    ph: int
    x_lo: float
    x_hi: float
    y_lo: float
    y_hi: float

    def px(self, v: float) -> float:
        return self.left + (v - self.x_lo) / (self.x_hi - self.x_lo) * self.pw

    def py(self, v: float) -> float:
        return self.top + (self.y_hi - v) / (self.y_hi - self.y_lo) * self.ph


def svg_plot(
    series: Sequence[Series],
    *,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    bands: Sequence[Band] = (),
    width: int = 860,
    height: int = 420,
    legend: bool = True,
    max_points: int | None = None,
    note: str = "",
) -> str:
    """Render the series (and bands) on shared linear axes; returns the SVG document as a string.

    A series with more than `max_points` values (default: twice the plot's width in pixels) and `thin` set is
    drawn decimated (`decimate`, one pass per pixel column). `note` is a small line under the title; when a series was
    thinned it says so."""
    esc = html.escape
    left, right, top, bottom = 70, 170 if legend else 20, 36, 50
    pw, ph = width - left - right, height - top - bottom
    limit = 2 * pw if max_points is None else max_points
    x_lo, x_hi = _x_range(series, bands)
    drawn, thinned = _drawn(series, x_lo, x_hi, pw, limit)
    f = _Frame(left, top, pw, ph, x_lo, x_hi, *_y_range(drawn))
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    if title:
        out.append(
            f'<text x="{left + pw / 2:.1f}" y="20" text-anchor="middle" font-size="14">{esc(title)}</text>'
        )
    if thinned:  # say so where the reader looks: the extremes are all there, the values between them are not
        note = (
            note + "; " if note else ""
        ) + "dense series: the lowest and highest value of each pixel column"
    if note:
        out.append(
            f'<text x="{left + pw / 2:.1f}" y="32" text-anchor="middle" font-size="10" fill="#555">{esc(note)}</text>'
        )
    for b in bands:
        x0, x1 = f.px(max(b.x0, x_lo)), f.px(min(b.x1, x_hi))
        out.append(
            f'<rect x="{x0:.1f}" y="{top}" width="{max(0.0, x1 - x0):.1f}" height="{ph}" '
            f'fill="{b.color}" fill-opacity="{b.opacity}"/>'
        )
    out += _axes(f, height, xlabel, ylabel)
    # Data.
    legend_rows: list[tuple[str, str, str]] = [(b.label, b.color, "band") for b in bands if b.label]
    for n, (s, pairs) in enumerate(zip(series, drawn, strict=True)):
        color = s.color or PALETTE[n % len(PALETTE)]
        out += _series_svg(s, pairs, color, f)
        if s.label:
            legend_rows.append((s.label, color, s.kind if s.kind == "line" else s.marker))
    if legend and legend_rows:
        out += _legend(legend_rows, left + pw + 12, top)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _x_range(series: Sequence[Series], bands: Sequence[Band]) -> tuple[float, float]:
    """The x range of every series and band (widened by half a unit either side when it is one value)."""
    # min/max per series (C loops), not a float() per value: a series may hold 100k values.
    xs = [float(v) for s in series if len(s.x) for v in (min(s.x), max(s.x))]
    xs += [v for b in bands for v in (b.x0, b.x1)]
    x_lo, x_hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 0.5, x_hi + 0.5
    return x_lo, x_hi


def _drawn(
    series: Sequence[Series], x_lo: float, x_hi: float, pw: int, limit: int
) -> tuple[list[list[tuple[float, float | None]]], bool]:
    """Each series' (x, y) pairs to draw, decimated over the `pw` pixel columns when it has more than `limit`
    values and may be thinned; and whether any was."""
    drawn: list[list[tuple[float, float | None]]] = []
    thinned = False
    for s in series:
        if len(s.x) != len(s.y):
            raise ValueError(f"series {s.label!r}: {len(s.x)} x values but {len(s.y)} y values")
        if s.thin and len(s.x) > limit:
            thinned = True
            drawn.append([(s.x[i], s.y[i]) for i in decimate(s.x, s.y, x_lo, x_hi, pw, s.kind == "line")])
        else:
            drawn.append(list(zip(s.x, s.y, strict=True)))
    return drawn, thinned


def _y_range(drawn: list[list[tuple[float, float | None]]]) -> tuple[float, float]:
    """The finite y values' range, padded by 5% either side (a single value: by 5% of it, or 0.5)."""
    ys = [float(v) for pairs in drawn for _, v in pairs if v is not None and math.isfinite(v)]
    y_lo, y_hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    if y_hi == y_lo:
        pad = abs(y_lo) * 0.05 or 0.5
        y_lo, y_hi = y_lo - pad, y_hi + pad
    pad = (y_hi - y_lo) * 0.05
    return y_lo - pad, y_hi + pad


def _axes(f: _Frame, height: int, xlabel: str, ylabel: str) -> list[str]:
    """The plot area's frame, the x ticks, the y ticks with their grid lines, the axis labels."""
    esc = html.escape
    left, top, pw, ph = f.left, f.top, f.pw, f.ph
    out = [f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>']
    for t in nice_ticks(f.x_lo, f.x_hi, 8):
        x = f.px(t)
        out.append(f'<line x1="{x:.1f}" y1="{top + ph}" x2="{x:.1f}" y2="{top + ph + 4}" stroke="#444"/>')
        out.append(f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle">{_fmt(t)}</text>')
    for t in nice_ticks(f.y_lo, f.y_hi, 6):
        y = f.py(t)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    if xlabel:
        out.append(
            f'<text x="{left + pw / 2:.1f}" y="{height - 12}" text-anchor="middle">{esc(xlabel)}</text>'
        )
    if ylabel:
        out.append(
            f'<text x="16" y="{top + ph / 2:.1f}" text-anchor="middle" '
            f'transform="rotate(-90 16 {top + ph / 2:.1f})">{esc(ylabel)}</text>'
        )
    return out


def _series_svg(s: Series, pairs: list[tuple[float, float | None]], color: str, f: _Frame) -> list[str]:
    """A line (one polyline per run of finite values: it breaks at a gap) or its points' markers."""
    out = []
    if s.kind == "line":
        runs: list[list[str]] = []
        run: list[str] = []
        for x, y in pairs:
            if y is None or not math.isfinite(y):
                if run:
                    runs.append(run)
                run = []
            else:
                run.append(f"{f.px(x):.1f},{f.py(y):.1f}")
        if run:
            runs.append(run)
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        for r in runs:
            out.append(
                f'<polyline points="{" ".join(r)}" fill="none" stroke="{color}" '
                f'stroke-width="{s.width}" stroke-opacity="{s.opacity}"{dash}/>'
            )
    else:
        for x, y in pairs:
            if y is not None and math.isfinite(y):
                out.append(_marker(s.marker, f.px(x), f.py(y), s.size, color, s.opacity))
    return out


def _legend(rows: list[tuple[str, str, str]], lx: int, top: int) -> list[str]:
    """One legend row per band and labelled series (label, colour, band | line | marker), from (lx, top)."""
    esc = html.escape
    out = []
    for i, (label, color, kind) in enumerate(rows):
        y = top + 10 + i * 18
        if kind == "band":
            out.append(
                f'<rect x="{lx}" y="{y - 6}" width="16" height="12" fill="{color}" fill-opacity="0.25"/>'
            )
        elif kind == "line":
            out.append(
                f'<line x1="{lx}" y1="{y}" x2="{lx + 16}" y2="{y}" stroke="{color}" stroke-width="2"/>'
            )
        else:
            out.append(_marker(kind, lx + 8, y, 4, color, 1.0))
        out.append(f'<text x="{lx + 22}" y="{y + 4}">{esc(label)}</text>')
    return out
