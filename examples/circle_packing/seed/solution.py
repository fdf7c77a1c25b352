"""Circle packing: 26 circles in the unit square, maximise the sum of their radii.

The grader calls `pack()` and checks the result. The layout is built from the constants below; a quick
experiment is to change one of them and run `coral eval`. Tunable constants and sensible ranges:

  ROWS          int    4 .. 7      rows the 26 centres are spread over (26 // ROWS per row, the rest one more)
  MARGIN        float  0.04 .. 0.2 distance of the outermost centres from the walls; 0 gives zero radii (invalid)
  STAGGER       float  0.0 .. 1.0  shift of every second row, in units of one column spacing
  ROW_SPREAD    float  0.8 .. 1.2  >1 pushes the inner rows apart (more room in the middle), <1 pulls them in
  GROW_PASSES   int    0 .. 8      greedy passes that enlarge each circle into the free space around it
  RADIUS_SCALE  float  0.9 .. 1.0  final shrink of every radius; above 1.0 circles overlap (invalid packing)
"""

import math

ROWS = 4
MARGIN = 0.14
STAGGER = 1.0
ROW_SPREAD = 1.0
GROW_PASSES = 0
RADIUS_SCALE = 0.95

N = 26


def row_sizes(n, rows):
    """Spread n centres over rows as evenly as possible, the larger rows alternating from the middle out."""
    base, extra = divmod(n, rows)
    sizes = [base] * rows
    order = sorted(range(rows), key=lambda j: (abs(j - (rows - 1) / 2), j))
    for j in order[:extra]:
        sizes[j] += 1
    return sizes


def row_positions(rows):
    """Vertical position of each row in [0, 1], spread apart in the middle when ROW_SPREAD > 1."""
    if rows == 1:
        return [0.5]
    ts = [j / (rows - 1) for j in range(rows)]
    # t -> 0.5 + sign * |2t-1|^(1/ROW_SPREAD) / 2: 1.0 is linear spacing.
    return [0.5 + math.copysign(abs(2 * t - 1) ** (1 / ROW_SPREAD), 2 * t - 1) / 2 for t in ts]


def centres():
    pts = []
    span = 1 - 2 * MARGIN
    for j, (count, ty) in enumerate(zip(row_sizes(N, ROWS), row_positions(ROWS), strict=True)):
        shift = STAGGER if j % 2 else 0.0
        for i in range(count):
            tx = 0.5 if count == 1 else (i + shift) / (count - 1 + STAGGER)
            pts.append((MARGIN + tx * span, MARGIN + ty * span))
    return pts


def radii(pts):
    """Safe radii (half the nearest distance, limited by the walls), then greedy growth into free space."""
    n = len(pts)
    dist = [[math.dist(p, q) for q in pts] for p in pts]
    wall = [min(x, y, 1 - x, 1 - y) for x, y in pts]
    r = [min([wall[i]] + [dist[i][j] / 2 for j in range(n) if j != i]) for i in range(n)]
    for _ in range(GROW_PASSES):
        for i in range(n):
            r[i] = min([wall[i]] + [dist[i][j] - r[j] for j in range(n) if j != i])
    return [max(0.0, x) * RADIUS_SCALE for x in r]


def pack():
    """Return 26 circles as (x, y, r) tuples."""
    pts = centres()
    return [(x, y, r) for (x, y), r in zip(pts, radii(pts), strict=True)]
