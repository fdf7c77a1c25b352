"""The small SVG plot helper (sftree.svg)."""

import re
import xml.etree.ElementTree as ET

import pytest

from sftree.svg import Band, Series, decimate, nice_ticks, svg_plot


def test_nice_ticks():
    assert nice_ticks(0, 10, 5) == [0, 2, 4, 6, 8, 10]
    assert nice_ticks(0.13, 0.91, 4) == pytest.approx([0.2, 0.4, 0.6, 0.8])  # raw step 0.195 -> 0.2
    assert nice_ticks(0, 1, 4) == [0, 0.25, 0.5, 0.75, 1.0]  # 0.25 -> 2.5 x 0.1
    assert nice_ticks(-3, 3, 3) == [-2, 0, 2]
    assert nice_ticks(5, 5) == [5]


def test_svg_is_valid_and_has_every_part():
    svg = svg_plot(
        [
            Series([1, 2, 3, 4], [1.0, None, 3.0, 4.0], "line", "smooth <x>"),
            Series([2, 3], [2.0, 3.0], "points", "chosen", marker="diamond"),
            Series([4], [4.0], "points", "failed", marker="cross"),
        ],
        title="T & t",
        xlabel="index",
        ylabel="score",
        bands=[Band(0.5, 2.5, "#00f", "early"), Band(2.5, 4.5, "#f00", "late")],
    )
    root = ET.fromstring(svg)  # well-formed XML, text escaped
    assert root.tag.endswith("svg")
    assert svg.count("<polyline") == 2  # the None splits the line in two runs
    assert svg.count("<polygon") == 3  # two diamonds in the plot and the legend swatch
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "T & t" in texts and "smooth <x>" in texts and "early" in texts and "late" in texts
    assert len(re.findall(r'fill-opacity="0.12"', svg)) == 2  # two bands


# 30 values over 10 pixel columns of 3 (x_lo 0, x_hi 30); the expected positions are worked out by hand.
Y = [5, 1, 9, 2, 2, 2, 3, 7, 3, 0, 0, 8, 4, 4, 4, 1, 2, 3, 3, 2, 1, 6, 6, 6, 9, 1, 5, 2, 8, 2]
# per column: first lowest, first highest (ties: the first one), plus the series' first and last value
POINTS = {0, 1, 2, 3, 6, 7, 9, 11, 12, 15, 17, 18, 20, 21, 24, 25, 27, 28, 29}
EDGES = {c + d for c in range(0, 30, 3) for d in (0, 2)}  # a line also keeps each column's first and last


def test_decimate_keeps_each_columns_extremes():
    x = list(range(30))
    assert decimate(x, Y, 0, 30, 10, line=False) == sorted(POINTS)
    assert decimate(x, Y, 0, 30, 10, line=True) == sorted(POINTS | EDGES)
    # unsorted input: the same points, as positions in the caller's order
    order = [7, 3, 29, 0, 15] + [i for i in range(30) if i not in (7, 3, 29, 0, 15)]
    kept = decimate([x[i] for i in order], [Y[i] for i in order], 0, 30, 10, line=False)
    assert sorted(order[k] for k in kept) == sorted(POINTS)


def test_decimate_keeps_gaps_and_skips_non_finite():
    y = [float(v) for v in Y]
    y[4], y[16] = None, float("nan")  # column 1 becomes [2, gap, 2]; column 5 [1, nan, 3]
    kept = decimate(list(range(30)), y, 0, 30, 10, line=True)
    assert 4 in kept and 16 in kept  # the first gap of each column stays, so the line breaks there
    assert {15, 17} <= set(kept)  # column 5's lowest and highest finite values
    assert decimate(list(range(30)), y, 0, 30, 10, line=False) == sorted(POINTS - {16})


def test_decimate_huge_and_infinite_values_and_empty():
    y = [1e308] * 30
    y[7], y[20] = 1.7e308, float("inf")  # an exact sum beyond the float range, and an infinity
    kept = decimate(list(range(30)), y, 0, 30, 10, line=False)
    assert 7 in kept and 20 not in kept  # the highest finite value of column 2 is drawn, inf is not a value
    assert decimate([], [], 0, 1, 10, line=True) == []


def _circles(svg, r="3.0"):
    return [
        (float(a), float(b)) for a, b in re.findall(rf'<circle cx="([-\d.]+)" cy="([-\d.]+)" r="{r}"', svg)
    ]


def test_many_points_keep_every_columns_extremes_and_the_file_stays_small():
    n = 100_000
    y = [float((i * 7919) % 1013) for i in range(n)]
    y[31_337], y[77_777] = -500.0, 2000.0  # one outlier each way, far from the rest
    svg = svg_plot([Series(list(range(n)), y, "points")], legend=False, width=520, height=300)
    dots = _circles(svg)
    assert len(dots) <= 2 * 500 + 2 and len(svg) < 150_000  # plot area: 520 - 70 - 20 = 500 px
    top, bottom = min(cy for _, cy in dots), max(cy for _, cy in dots)
    # y range -500..2000 padded by 5%: -625..2125 over the 214 px plot height, from y = 36
    assert top == pytest.approx(36 + (2125 - 2000) / 2750 * 214, abs=0.06)  # the outliers are drawn
    assert bottom == pytest.approx(36 + (2125 + 500) / 2750 * 214, abs=0.06)
    assert "lowest and highest value of each pixel column" in svg
    few = svg_plot([Series(list(range(3000)), [1.0] * 3000, "points", thin=False)], legend=False)
    assert len(_circles(few)) == 3000 and "pixel column" not in few
