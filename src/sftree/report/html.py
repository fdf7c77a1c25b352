"""The self-contained HTML report (`sftree report --results DIR --out report.html`).

Everything is inline (SVG, CSS, a few lines of JS), so the file opens in any browser without network:

- per task: the Student's learning curve (scores, smoothed curve, stage bands, chosen roots) from `stages.tsv`;
- per tree: a drawing with nodes by depth, coloured by score, failed and pruned attempts drawn as red crosses,
  selected paths highlighted; hovering a node shows its score and tokens, clicking shows the full breakdown
  (Select breakdown of each dispatch from that node, the edge that made it); then the ranked paths table;
- whether to trust it (`sftree.records.trust`): per task the snapshots skipped (pending, failed evals) and the
  sandbox mode; per root and path the root score, leaf score and signed gain, paths ending below their root flagged;
- dataset statistics as the merge counted them for the card (`sft.figures.json`: records by task and stage, tokens,
  tools called in trained responses, exact-duplicate targets, records by agent backend with those not made by
  OpenCode flagged, the Coral world) and from `sft.stats.json` (the ill-formed steps never trained, by reason;
  steps skipped). The report reads records only through `sftree.records` (stages.tsv: `records.stages`), what
  those leave as open JSON (the export stats, a tree's Teacher record, an edge's Select breakdown) through the
  checked readers of `report/inputs.py`, and no stage's code.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sftree.errors import InputError
from sftree.fileio import write_text_atomic
from sftree.progress import Progress
from sftree.records.paths import Paths, RankedPath, paths_path, read_paths
from sftree.records.scores import best_of, oriented, signed_gain
from sftree.records.sft import EXCLUSION_REASONS, OPENCODE, merged_path, read_figures, read_stats, stats_path
from sftree.records.stages import StageRow, read_stages, task_tables
from sftree.records.tree import FINAL_NAME, Edge, Node, Select, Tree, final_path, read_tree
from sftree.records.trust import RootTrust, root_trust, skipped_counts
from sftree.report.inputs import ExportView, select_breakdown, teacher_report

if TYPE_CHECKING:  # the Teacher's own type for its record (the report imports no Teacher code to run)
    from sftree.teacher.client import TeacherReport

log = logging.getLogger("sftree.report.html")

STAGE_COLORS = {"early": "#1f77b4", "middle": "#2ca02c", "late": "#ff7f0e"}  # as in select_roots' stages.svg
SELECTED = "#f59e0b"
FAILED = "#dc2626"
# viridis stops: low score dark purple -> high score yellow
VIRIDIS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"]


def esc(x: object) -> str:
    return html.escape(str(x), quote=True)


def fmt(x: object, nd: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return (
            f"{x:.{nd}g}"
            if (x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3))
            else f"{x:.{nd}f}".rstrip("0").rstrip(".")
        )
    return str(x)


def _hex(c: str) -> tuple[int, int, int]:
    return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)


def color_scale(t: float | None) -> str:
    """t in [0, 1] -> viridis colour; None -> grey."""
    if t is None or math.isnan(t):
        return "#9ca3af"
    t = min(1.0, max(0.0, t)) * (len(VIRIDIS) - 1)
    i = min(int(t), len(VIRIDIS) - 2)
    a, b, f = _hex(VIRIDIS[i]), _hex(VIRIDIS[i + 1]), t - i
    return "#" + "".join(f"{round(a[k] + (b[k] - a[k]) * f):02x}" for k in range(3))


def _drawn(x: float | None) -> float | None:
    """A number of stages.tsv as the learning curve draws it: NaN as no value, as the report always has (the
    table holds any float `repr` writes, NaN included)."""
    return None if x is None or math.isnan(x) else x


# --- inputs ---------------------------------------------------------------------------------------------


@dataclass
class TreeView:
    task: str
    root: str
    tree: Tree
    paths: Paths | None
    tree_dir: Path

    @property
    def ranked(self) -> tuple[RankedPath, ...]:
        """The tree's candidate paths, best first (none before select-paths ran)."""
        return self.paths.paths if self.paths else ()


@dataclass
class TaskView:
    name: str
    task_dir: Path | None = None
    stages: list[StageRow] = field(default_factory=list)
    trees: list[TreeView] = field(default_factory=list)


def collect(results: Path) -> list[TaskView]:
    tasks: dict[str, TaskView] = {}
    for tsv in task_tables(results):
        tasks.setdefault(tsv.parent.name, TaskView(tsv.parent.name, tsv.parent)).stages = read_stages(tsv)
    # only the roots the current stages.tsv chose (a tree left over from an earlier config is not shown)
    chosen = {name: {r.snapshot for r in t.stages if r.selected} for name, t in tasks.items()}
    tree_files = [
        f
        for f in sorted(results.glob(f"*/trees/*/{FINAL_NAME}"))
        if f.parents[2].name not in chosen or f.parent.name in chosen[f.parents[2].name]
    ]
    progress = Progress("report trees", total=len(tree_files), logger=log)
    for tf in tree_files:
        task = tf.parent.parent.parent.name
        pf = paths_path(tf.parent)
        view = TreeView(
            task,
            tf.parent.name,
            read_tree(tf, check=False),
            read_paths(pf) if pf.is_file() else None,
            tf.parent,
        )
        tasks.setdefault(task, TaskView(task)).trees.append(view)
        progress.update()
    progress.finish()
    return [tasks[k] for k in sorted(tasks)]


@dataclass(frozen=True)
class DatasetView:
    """The dataset's figures as the report shows them: the merge's `sft.figures.json` (dataset/figures.py) and the
    merged export stats."""

    records: int
    messages: int
    by_task_stage: Counter[tuple[str, str]]
    by_root: Counter[tuple[str, str]]
    tools: Counter[str]
    tokens: Counter[str]  # the Teacher server's `usage`, summed
    malformed: int
    duplicates: int
    backends: dict[str, int]
    corals: dict[str, int]
    export: ExportView | None  # None: no stats file beside the merged file


def dataset_stats(results: Path) -> DatasetView | None:
    """The dataset's figures as the merge counted them (`sft.figures.json`, the card's own: dataset/figures.py),
    with the merged export stats (`sft.stats.json`); None before the merge. The records are not read again."""
    sft = merged_path(results)
    doc = read_figures(sft)
    if doc is None:
        return None
    stats_file = stats_path(sft)
    stats = read_stats(stats_file, check=False) if stats_file.is_file() else None
    return DatasetView(
        records=doc["records"],
        messages=doc["messages"],
        by_task_stage=Counter({(t, s): n for t, s, n in doc["by_task_stage"]}),
        by_root=Counter({(t, r): row["records"] for t, r, row in doc["roots"]}),
        tools=Counter(doc["tools"]),
        tokens=Counter(doc["tokens"]),
        malformed=doc["malformed"],
        duplicates=doc["duplicates"],
        backends=doc["backends"],
        corals=doc["corals"],
        export=None if stats is None else ExportView.from_doc(stats, str(stats_file)),
    )


def learning_curve_svg(stage_rows: list[StageRow], task: str, direction: str | None) -> str:
    """The Student's scores over the global eval index (svg.svg_plot): stage bands, smoothed curve, chosen roots."""
    from sftree.svg import Band, Series, svg_plot

    # (global index, row) in index order; the index as a float, the plot's x
    indexed = sorted(((float(r.global_index), r) for r in stage_rows), key=lambda gr: gr[0])
    if not indexed:
        return "<p>No snapshots in stages.tsv.</p>"
    x = [g for g, _ in indexed]
    rows = [r for _, r in indexed]

    def scored(r: StageRow) -> bool:
        return r.eval_ok and _drawn(r.score) is not None

    ok = [(g, r) for g, r in indexed if scored(r)]
    bad = [(g, r) for g, r in indexed if not scored(r)]
    chosen = [(g, r) for g, r in indexed if r.selected]
    bands: list[Band] = []
    labelled: set[str] = set()
    start = 0
    for i in range(1, len(rows) + 1):  # runs of one stage, split halfway between neighbours
        if i == len(rows) or rows[i].stage != rows[start].stage:
            x0 = x[0] - 0.5 if start == 0 else (x[start - 1] + x[start]) / 2
            x1 = x[-1] + 0.5 if i == len(rows) else (x[i - 1] + x[i]) / 2
            stage = rows[start].stage
            bands.append(Band(x0, x1, STAGE_COLORS[stage], None if stage in labelled else stage, 0.16))
            labelled.add(stage)
            start = i

    def gi(rs: list[tuple[float, StageRow]]) -> list[float]:
        return [g for g, _ in rs]

    def y_of(r: StageRow) -> float | None:
        score = _drawn(r.score)
        return score if score is not None else _drawn(r.score_for_stage)

    series = [
        Series(
            gi(ok),
            [_drawn(r.score) for _, r in ok],
            "points",
            "score (eval ok)",
            "#2563eb",
            size=2.4,
            opacity=0.8,
        ),
        Series(
            gi(bad),
            [_drawn(r.score_for_stage) for _, r in bad],
            "points",
            "eval failed",
            FAILED,
            marker="cross",
        ),
        Series(x, [_drawn(r.smooth_score) for r in rows], "line", "smoothed", "#111827", width=1.8),
        Series(
            gi(chosen),
            [y_of(r) for _, r in chosen],
            "points",
            f"chosen roots ({len(chosen)})",
            SELECTED,
            marker="ring",
            size=6,
            thin=False,  # every root drawn, however many
        ),
    ]
    title = f"{task}: Student learning curve ({direction or 'direction unknown'})"
    return svg_plot(
        series, title=title, xlabel="global eval index", ylabel="score", bands=bands, width=1000, height=340
    )


def _num_key(s: str) -> tuple[int, str]:
    m = re.search(r"(\d+)$", s or "")
    return (int(m.group(1)) if m else 1 << 30, s or "")


def _selected(view: TreeView) -> tuple[set[str], set[str]]:
    """The edges and the nodes of the tree's selected paths."""
    selected_edges: set[str] = set()
    selected_nodes: set[str] = set()
    for p in view.ranked:
        if p.selected:
            selected_edges.update(p.edges)
            selected_nodes.update(p.nodes)
    return selected_edges, selected_nodes


def _place(
    root_id: str, kids: defaultdict[str, list[Edge]], nodes: dict[str, Node]
) -> tuple[dict[str, tuple[float, int]], int]:
    """(slot x, depth) of each node and, under "x:<edge>", of each failed attempt: leaves in slots left to right,
    parents centred over their children; and the number of slots."""
    pos: dict[str, tuple[float, int]] = {}  # node id or "x:<edge>" -> (slot x, depth)
    slot = [0]

    def place(nid: str, depth: int) -> float:
        xs: list[float] = []
        for e in kids[nid]:  # a leaf has none (kids is a defaultdict)
            child = e.child
            if child and child in nodes:
                xs.append(place(child, depth + 1))
            else:
                pos["x:" + e.id] = (slot[0], depth + 1)
                xs.append(slot[0])
                slot[0] += 1
        x: float
        if not xs:
            x = slot[0]
            slot[0] += 1
        else:
            x = (min(xs) + max(xs)) / 2
        pos[nid] = (x, depth)
        return x

    place(root_id, 0)
    return pos, slot[0]


XY = Callable[[str], tuple[float, float]]  # a node id (or "x:<edge>") -> its centre in the drawing


def _edge_svg(e: Edge, xy: XY, nodes: dict[str, Node], selected_edges: set[str]) -> str:
    """An edge's line to its child (orange when selected, dashed red when kept despite a failed turn), or a
    failed attempt's dashed line to a red cross."""
    px, py = xy(e.parent)
    child = e.child
    tip = (
        f"edge {e.id} attempt {e.attempt}: score {fmt(e.score)}, soft {fmt(e.soft)}, "
        f"tool error rate {fmt(e.tool_error_rate)}, tokens {e.tokens}"
    )
    if child and child in nodes:
        cx, cy = xy(child)
        sel = e.id in selected_edges
        # kept although a turn failed (fallback retry at depth 1, exemption at depth 2): dashed
        kept_failed = e.pruned or any(t.score is None for t in e.turns)
        if kept_failed:
            tip += "; a turn had no numeric score (kept: fallback/exemption)"
        dash = ' stroke-dasharray="6 4"' if kept_failed else ""
        stroke = SELECTED if sel else (FAILED if kept_failed else "#9ca3af")
        return (
            f'<line x1="{px:.1f}" y1="{py:.1f}" x2="{cx:.1f}" y2="{cy:.1f}" stroke="{stroke}" '
            f'stroke-width="{5 if sel else 1.5}"{dash}>'
            f"<title>{esc(tip)}</title></line>"
        )
    cx, cy = xy("x:" + e.id)
    reason = e.prune_reason or "failed"
    return (
        f'<line x1="{px:.1f}" y1="{py:.1f}" x2="{cx:.1f}" y2="{cy:.1f}" stroke="{FAILED}" stroke-width="1.2" '
        f'stroke-dasharray="4 3"/><g class="fail"><title>{esc(tip + f"; pruned: {reason}")}</title>'
        f'<path d="M{cx - 6:.1f},{cy - 6:.1f}L{cx + 6:.1f},{cy + 6:.1f}M{cx + 6:.1f},{cy - 6:.1f}L{cx - 6:.1f},{cy + 6:.1f}" '
        f'stroke="{FAILED}" stroke-width="2.5"/></g>'
    )


Dispatch = tuple[str, Select]  # an edge's id and the Select breakdown logged when it was dispatched


def _dispatches(view: TreeView) -> tuple[dict[str, Select], defaultdict[str, list[Dispatch]]]:
    """The Select breakdown of each edge that logged one (checked: report/inputs.py), and the dispatches from
    each node, in edge order."""
    tree_file = final_path(view.tree_dir)
    selects: dict[str, Select] = {}
    for e in view.tree.edges:
        sel = select_breakdown(e.select, f"{tree_file}: edge {e.id}: select")
        if sel is not None:
            selects[e.id] = sel
    by_node: defaultdict[str, list[Dispatch]] = defaultdict(list)
    for edge_id, sel in selects.items():
        by_node[sel["node"]].append((edge_id, sel))
    return selects, by_node


def _node_info(
    n: Node, into: Edge | None, selects: dict[str, Select], dispatched: list[Dispatch], on_selected: bool
) -> dict[str, object]:
    """What clicking a node shows: its figures, the edge that made it (and that edge's Select), the Select
    breakdown of each dispatch from it."""
    info: dict[str, object] = {
        "node": n.id,
        "depth": n.depth,
        "score": n.score,
        "path_best_score": n.path_best_score,
        "tokens (max_token_total)": n.max_token_total,
        "status": n.status,
        "leaf_reason": n.leaf_reason,
        "valid_children": n.valid_children,
        "failed_expansions": n.failed_expansions,
        "on selected path": on_selected,
    }
    if into:
        info["made by edge"] = {
            "id": into.id,
            "attempt": into.attempt,
            "exempt": into.exempt,
            "steps": into.steps,
            "tool_error_rate": into.tool_error_rate,
            "outcome": into.outcome,
            "cleanliness": into.cleanliness,
            "knowledge_score": into.knowledge_score,
            "regression_stability": into.regression_stability,
            "soft": into.soft,
            "wall_s": into.wall_s,
        }
        if into.id in selects:
            info["parent's Select when this edge was dispatched"] = selects[into.id]
    if dispatched:
        info["Select breakdown of dispatches from this node"] = [{"edge": e, **sel} for e, sel in dispatched]
    return info


def _node_tip(n: Node, dispatched: list[Dispatch]) -> str:
    """What hovering a node shows: score, tokens, the last dispatch's Select, why it is a leaf."""
    tip = f"{n.id}: score {fmt(n.score)}, tokens {n.max_token_total}"
    if dispatched:
        last = dispatched[-1][1]
        tip += (
            f"\nSelect {fmt(last['select'])} = Q {fmt(last['Q'])} + alpha x T (T {fmt(last['T'])}; "
            f"score_rank {fmt(last['score_rank'])}, best_rank {fmt(last['best_rank'])}, process {fmt(last['process'])})"
        )
    if n.leaf_reason:
        tip += f"\nleaf: {n.leaf_reason}"
    return tip


def _tree_legend(lo: float, hi: float, direction: str) -> str:
    return (
        '<div class="legend"><span class="grad">score '
        f"{fmt(lo if direction != 'minimize' else -lo)}"
        '<i style="width:90px;background:linear-gradient(90deg,' + ",".join(VIRIDIS) + ')"></i>'
        f"{fmt(hi if direction != 'minimize' else -hi)}</span>"
        f'<span><i style="background:{SELECTED};height:4px"></i>selected path</span>'
        f'<span><b style="color:{FAILED}">&#x2715;</b> failed / pruned attempt</span>'
        f'<span><i style="border-top:2px dashed {FAILED};height:0"></i>kept despite a failed turn</span>'
        '<span><i style="background:#111827;width:6px;height:6px"></i>leaf</span>'
        '<span><i style="background:#9ca3af;border-radius:50%"></i>no score</span></div>'
    )


def tree_svg(view: TreeView, uid: str) -> str:
    """Nodes by depth (rows), leaves spread left to right, parents centred over their children."""
    tree = view.tree
    direction = tree.direction or "maximize"
    nodes = {n.id: n for n in tree.nodes}
    edges = tree.edges
    root = next((n for n in nodes.values() if n.parent is None), None)
    if root is None:
        return "<p>Tree has no root node.</p>"
    selected_edges, selected_nodes = _selected(view)
    # children of a node: its edges (a failed attempt is a child slot without a node)
    kids: defaultdict[str, list[Edge]] = defaultdict(list)
    for e in edges:
        kids[e.parent].append(e)
    for v in kids.values():
        v.sort(key=lambda e: _num_key(e.id))
    selects, dispatches = _dispatches(view)

    pos, slots = _place(root.id, kids, nodes)
    scores = [oriented(n.score, direction) for n in nodes.values()]
    numeric = [s for s in scores if s is not None]
    lo, hi = (min(numeric), max(numeric)) if numeric else (0.0, 1.0)
    max_depth = max(d for _, d in pos.values())
    dx, dy, m = 56, 80, 30
    width = max(int(slots * dx + 2 * m), 320)
    height = int(max_depth * dy + 2 * m + 10)

    def xy(key: str) -> tuple[float, float]:
        x, d = pos[key]
        return m + x * dx + dx / 2, m + d * dy

    out = [f'<svg class="tree" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">']
    for e in edges:
        if e.parent in pos:
            out.append(_edge_svg(e, xy, nodes, selected_edges))
    edge_by_id = {e.id: e for e in edges}
    for nid, n in sorted(nodes.items(), key=lambda kv: _num_key(kv[0])):
        if nid not in pos:
            continue
        x, y = xy(nid)
        s = oriented(n.score, direction)
        t = None if s is None else (0.5 if hi == lo else (s - lo) / (hi - lo))
        into = edge_by_id.get(n.edge or "") or next((e for e in edges if e.child == nid), None)
        info = _node_info(n, into, selects, dispatches[nid], nid in selected_nodes)
        tip = _node_tip(n, dispatches[nid])
        r = 11 if nid == root.id else 9
        stroke = SELECTED if nid in selected_nodes else "#111827"
        out.append(
            f'<g class="node" tabindex="0" data-tree="{esc(uid)}" data-info="{esc(json.dumps(info))}">'
            f"<title>{esc(tip)}</title>"
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{color_scale(t)}" stroke="{stroke}" '
            f'stroke-width="{3 if nid in selected_nodes else 1.2}"/>'
            + (
                f'<rect x="{x - 3:.1f}" y="{y + r + 2:.1f}" width="6" height="6" fill="#111827"/>'
                if n.leaf_reason
                else ""
            )
            + f'<text x="{x:.1f}" y="{y - r - 4:.1f}" text-anchor="middle" class="nid">{esc(nid)}</text></g>'
        )
    out.append("</svg>")
    legend = _tree_legend(lo, hi, direction)
    return f'<div class="scroll">{"".join(out)}</div>{legend}'


# --- HTML -----------------------------------------------------------------------------------------------

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#111827;background:#f9fafb}
main{max-width:1200px;margin:0 auto;padding:16px 24px 80px}
h1{font-size:24px;margin:8px 0} h2{font-size:20px;margin:28px 0 8px;border-bottom:2px solid #e5e7eb}
h3{font-size:16px;margin:16px 0 6px}
table{border-collapse:collapse;margin:8px 0;background:#fff;font-size:13px}
th,td{border:1px solid #e5e7eb;padding:3px 8px;text-align:right} th{background:#f3f4f6}
td.l,th.l{text-align:left} tr.sel td{background:#fff7ed} tr.below td{color:#b91c1c} .bad{color:#b91c1c}
.card{background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:10px 14px;margin:10px 0}
.legend{display:flex;flex-wrap:wrap;gap:14px;font-size:12px;color:#374151;margin:4px 0 8px}
.legend i{display:inline-block;width:14px;height:10px;margin-right:4px;vertical-align:middle}
.legend b{margin-right:4px}
.tick{font-size:11px;fill:#6b7280} .axis{font-size:12px;fill:#374151} .nid{font-size:10px;fill:#374151}
.scroll{overflow-x:auto} svg{background:#fff}
.node{cursor:pointer} .node:focus circle,.node:hover circle{stroke-width:3;stroke:#000}
details>summary{cursor:pointer;font-weight:600;margin:6px 0}
#details{position:fixed;right:12px;bottom:12px;width:380px;max-height:60vh;overflow:auto;background:#fff;
 border:1px solid #9ca3af;border-radius:8px;padding:10px;font:12px/1.4 ui-monospace,monospace;display:none;
 box-shadow:0 4px 16px rgba(0,0,0,.15);white-space:pre-wrap}
#details button{float:right}
.muted{color:#6b7280}
"""

JS = """
document.addEventListener('click', function (ev) {
  var g = ev.target.closest && ev.target.closest('.node');
  var box = document.getElementById('details');
  if (ev.target.id === 'details-close') { box.style.display = 'none'; return; }
  if (!g) return;
  var info = JSON.parse(g.getAttribute('data-info'));
  box.textContent = '';
  var b = document.createElement('button'); b.id = 'details-close'; b.textContent = 'close';
  box.appendChild(b);
  var pre = document.createElement('div');
  pre.textContent = g.getAttribute('data-tree') + '\\n' + JSON.stringify(info, null, 2);
  box.appendChild(pre);
  box.style.display = 'block';
});
"""


def _table(
    headers: list[str],
    rows: Sequence[Sequence[object]],
    left: int = 1,
    row_class: Callable[[int], str] | None = None,
) -> str:
    head = "".join(f'<th class="{"l" if i < left else ""}">{esc(h)}</th>' for i, h in enumerate(headers))
    body = []
    for ri, r in enumerate(rows):
        cls = f' class="{row_class(ri)}"' if row_class and row_class(ri) else ""
        body.append(
            f"<tr{cls}>"
            + "".join(f'<td class="{"l" if i < left else ""}">{esc(fmt(c))}</td>' for i, c in enumerate(r))
            + "</tr>"
        )
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def tree_trust(view: TreeView) -> RootTrust:
    return root_trust(view.task, view.root, view.tree, view.paths)


def _path_gain(trust: RootTrust, view: TreeView, path: RankedPath) -> tuple[float | None, float | None]:
    """(leaf score, signed gain over the root) of any candidate path, selected or not."""
    leaf = view.tree.node(path.leaf)
    score = leaf.score if leaf else None
    return score, signed_gain(trust.root_score, score, trust.direction)


def _tree_summary(view: TreeView, trust: RootTrust) -> str:
    """The tree's line: its size, failed and kept attempts, root and best score, paths selected, sandbox, stop."""
    t = view.tree
    nodes = t.nodes
    edges = t.edges
    failed = sum(1 for e in edges if not e.child)
    kept = sum(1 for e in edges if e.child and any(x.score is None for x in e.turns))
    root = t.root_node
    best = [n.score for n in nodes if n.parent is not None and n.score is not None]
    direction = t.direction or "maximize"
    best_score = best_of(best, direction)
    paths = view.ranked
    nsel = sum(1 for p in paths if p.selected)
    below = (
        f', <b class="bad">{trust.below_root} selected ending below the root</b>' if trust.below_root else ""
    )
    return (
        f"{esc(view.root)}: {len(nodes) - 1} nodes, {len(edges)} edges ({failed} failed attempt(s) without a node, "
        f"{kept} kept despite a failed turn), "
        f"root score {fmt(root.score if root else None)}, best {fmt(best_score)}, {nsel}/{len(paths)} paths selected{below}, "
        f"sandbox {esc(trust.sandbox)}, stop: {esc(t.stop_reason)}"
    )


def _paths_table(view: TreeView, trust: RootTrust, paths: tuple[RankedPath, ...]) -> str:
    """The ranked paths: each one's nodes, root and leaf score, signed gain (flagged below the root), PathScore
    and its parts, whether it was selected."""
    gains = {p.rank: _path_gain(trust, view, p) for p in paths}
    rows = [
        [
            p.rank,
            p.leaf,
            " → ".join(p.nodes),
            p.leaf_reason,
            trust.root_score,
            gains[p.rank][0],
            gains[p.rank][1],
            "below root" if (gains[p.rank][1] or 0) < 0 else "",
            p.max_score,
            p.max_score_rank,
            p.avg_score,
            p.avg_score_rank,
            p.avg_cleanliness,
            p.avg_knowledge,
            p.path_score,
            "yes" if p.selected else "",
        ]
        for p in paths
    ]
    return _table(
        [
            "rank",
            "leaf",
            "nodes",
            "leaf reason",
            "root score",
            "leaf score",
            "gain",
            "flag",
            "max score",
            "max rank",
            "avg score",
            "avg rank",
            "avg clean",
            "avg knowledge",
            "PathScore",
            "selected",
        ],
        rows,
        left=4,
        row_class=lambda i: " ".join(
            c
            for c, on in (
                ("sel", paths[i].selected),
                ("below", (gains[paths[i].rank][1] or 0) < 0),
            )
            if on
        ),
    )


def tree_section(view: TreeView, uid: str) -> str:
    t = view.tree
    c = t.counters or {}
    paths = view.ranked
    trust = tree_trust(view)
    parts = [
        f'<details open><summary>{_tree_summary(view, trust)}</summary><div class="card">',
        tree_svg(view, uid),
    ]
    if paths:
        parts.append(_paths_table(view, trust, paths))
    elif view.paths is None:
        parts.append('<p class="muted">No paths.json yet.</p>')
    excluded = view.paths.excluded if view.paths else ()
    if excluded:
        parts.append(
            '<p class="muted">Excluded leaves: '
            + "; ".join(f"{esc(x.leaf)} ({esc(x.reason)})" for x in excluded)
            + "</p>"
        )
    counters = ", ".join(f"{k} {v}" for k, v in c.items())
    if counters:
        parts.append(f'<p class="muted">Counters: {esc(counters)}</p>')
    parts.append(teacher_section(teacher_report(t.teacher, f"{final_path(view.tree_dir)}: teacher")))
    parts.append("</div></details>")
    return "".join(parts)


def teacher_section(teacher: TeacherReport | None) -> str:
    """The Teacher client's record of the tree (tree.json `teacher`, read by report/inputs.py): requests, the
    attempts sent again and why (stalled, cut, abandoned when the router reported a worker down), and the router's
    worker health changes."""
    if teacher is None or not teacher["requests"]:
        return ""
    failed = teacher["failed_attempts"]
    stalls, cut, aborts = teacher["stalls"], teacher["cut_streams"], teacher["worker_down_aborts"]
    line = (
        f"Teacher: {teacher['requests']} requests"
        + (" (streamed)" if teacher["stream"] else "")
        + (", behind sglang-router" if teacher["router"] else "")
        + f"; {failed} attempt(s) sent again: {stalls} stalled, {cut} cut, {aborts} abandoned when a worker went "
        f"down, {failed - stalls - cut - aborts} other (connection, HTTP, stream errors)"
    )
    cls = "bad" if failed else "muted"
    parts = [f'<p class="{cls}">{esc(line)}</p>']
    events = teacher["worker_events"]
    if events:
        parts.append(
            '<p class="bad">Workers: '
            + "; ".join(
                f"{esc(e['at'])} {esc(e['worker'])} {'up' if e['healthy'] else 'down'} "
                f"({esc(e['healthy_workers'])} of {esc(e['workers'])} healthy)"
                for e in events
            )
            + "</p>"
        )
    incidents = teacher["incidents"]
    if incidents:
        rows = [[i["at"], i["label"], i["attempt"], i["kind"], i["waited_s"], i["detail"]] for i in incidents]
        parts.append(_table(["at", "request", "attempt", "kind", "waited s", "detail"], rows, left=4))
    return "".join(parts)


def task_section(task: TaskView) -> str:
    direction = next((v.tree.direction for v in task.trees), None)
    parts = [f'<h2 id="task-{esc(task.name)}">Task {esc(task.name)}</h2>']
    if task.stages:
        counts = Counter(r.stage for r in task.stages)
        chosen = [r for r in task.stages if r.selected]
        _, failed, pending = skipped_counts(task.task_dir, task.stages) if task.task_dir else (0, 0, None)
        sandboxes = sorted({tree_trust(v).sandbox for v in task.trees}) or ["unknown"]
        parts.append(
            f"<h3>Student learning curve</h3><p>{len(task.stages)} snapshots "
            f"(early {counts['early']}, middle {counts['middle']}, late {counts['late']}), {len(chosen)} chosen roots. "
            f"Skipped as roots: {failed} failed evals (eval_ok false), "
            f"{'unknown' if pending is None else pending} pending snapshots (never graded, not in the table). "
            f"Sandbox: {esc(', '.join(sandboxes))}.</p>"
        )
        parts.append(
            f'<div class="card scroll">{learning_curve_svg(task.stages, task.name, direction)}</div>'
        )
        by_root = {v.root: v for v in task.trees}
        rows: list[list[object]] = []
        for r in chosen:
            v = by_root.get(r.snapshot)
            paths = v.ranked if v else ()
            trust = tree_trust(v) if v else None
            rows.append(
                [
                    r.snapshot,
                    r.stage,
                    r.selection_reason or "",  # an empty cell, not fmt's "-" of None, where a table has none
                    _drawn(r.score),
                    len(v.tree.nodes) - 1 if v else "-",
                    sum(p.selected for p in paths),
                    paths[0].path_score if paths else None,
                    trust.best_gain if trust else None,
                    trust.below_root if trust else "-",
                    trust.sandbox if trust else "-",
                ]
            )
        parts.append(
            _table(
                [
                    "root",
                    "stage",
                    "reason",
                    "score",
                    "tree nodes",
                    "selected paths",
                    "best PathScore",
                    "best gain (selected)",
                    "selected below root",
                    "sandbox",
                ],
                rows,
                left=3,
            )
        )
    parts.append(f"<h3>Trees ({len(task.trees)})</h3>")
    for i, v in enumerate(task.trees):
        parts.append(tree_section(v, f"{task.name}/{v.root}#{i}"))
    return "".join(parts)


def dataset_section(stats: DatasetView | None) -> str:
    if stats is None:
        return '<h2 id="dataset">Dataset</h2><p class="muted">No sft.jsonl yet.</p>'
    parts = [
        '<h2 id="dataset">Dataset</h2>',
        f"<p>{stats.records} records, {stats.messages} messages "
        f"({stats.messages / max(stats.records, 1):.1f} per record). Tokens (server usage of the exported "
        f"model calls): prompt {stats.tokens['prompt_tokens']}, completion {stats.tokens['completion_tokens']}, "
        f"total {stats.tokens['total_tokens']}. Malformed tool arguments kept raw: {stats.malformed}. "
        f"Duplicate trained messages (one an earlier record trains, tool-call ids aside): "
        f"{stats.duplicates} (<code>export.dedupe: true</code> removes them).</p>",
        _provenance_html(stats),
        _untrained_html(stats.export),
    ]
    tasks = sorted({t for t, _ in stats.by_task_stage}, key=str)
    stages = ["early", "middle", "late", "unknown"]
    rows = [
        [t]
        + [stats.by_task_stage[(t, s)] for s in stages]
        + [sum(stats.by_task_stage[(t, s)] for s in stages)]
        for t in tasks
    ]
    parts.append("<h3>Records by task and stage</h3>" + _table(["task"] + stages + ["total"], rows))
    rows = [
        [t, r, n]
        for (t, r), n in sorted(stats.by_root.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1])))
    ]
    parts.append("<h3>Records by root</h3>" + _table(["task", "root", "records"], rows, left=2))
    rows = [[name, n] for name, n in stats.tools.most_common()]
    parts.append("<h3>Tools called in the trained responses</h3>" + _table(["tool", "calls"], rows))
    return "".join(parts)


def _provenance_html(stats: DatasetView) -> str:
    """Which agent backend made the records (non-OpenCode ones flagged) and the Teacher's Coral world."""
    backends, corals = stats.backends, stats.corals
    other = sum(v for k, v in backends.items() if k != OPENCODE)
    text = (
        "Agent backend: " + (", ".join(f"{esc(k)} {v}" for k, v in sorted(backends.items())) or "none") + "."
    )
    if other:
        text = (
            f'<span class="warn"><b>{other} records were NOT made by OpenCode</b></span> ({text[:-1]}): their '
            "prompts are not OpenCode's context (<code>export.refuse_native: true</code> leaves them out)."
        )
    refused = stats.export.refused if stats.export else {}
    if refused:
        text += (
            " Left out by <code>export.refuse_native</code>: "
            + ", ".join(f"{esc(k)} {v}" for k, v in sorted(refused.items()))
            + "."
        )
    coral = ", ".join(f"{esc(k)} {v}" for k, v in sorted(corals.items())) or "none"
    return f"<p>{text} Teacher's world (Coral): {coral}.</p>"


def _untrained_html(export: ExportView | None) -> str:
    """The ill-formed steps never trained, by reason, and the steps skipped (from sft.stats.json)."""
    if export is None or export.excluded is None:
        return (
            '<p class="muted">Steps never trained: unknown (no export stats beside the per-task files).</p>'
        )
    excluded = export.excluded
    reasons = {k: excluded.get(k, 0) for k in EXCLUSION_REASONS} | {
        k: v for k, v in excluded.items() if k not in EXCLUSION_REASONS
    }
    skipped = export.skipped
    gaps = export.missing_stats
    missing = f" Not counted (no export stats): {esc(', '.join(gaps))}." if gaps else ""
    cut = (
        f" Path records cut before an ill-formed step: {export.paths_cut}."
        if export.granularity == "path"
        else ""
    )
    return (
        f"<p>Ill-formed steps never trained (kept in the history of later records): "
        f"{sum(reasons.values())} ({', '.join(f'{esc(k)} {v}' for k, v in reasons.items())}).{cut} "
        f"Steps skipped: {', '.join(f'{esc(k)} {v}' for k, v in sorted(skipped.items())) or 'none'}.{missing}</p>"
    )


def render(results: Path) -> str:
    tasks = collect(results)
    stats = dataset_stats(results)
    n_trees = sum(len(t.trees) for t in tasks)
    n_nodes = sum(max(len(v.tree.nodes) - 1, 0) for t in tasks for v in t.trees)
    n_sel = sum(p.selected for t in tasks for v in t.trees for p in v.ranked)
    nav = (
        " · ".join(f'<a href="#task-{esc(t.name)}">{esc(t.name)}</a>' for t in tasks)
        + ' · <a href="#dataset">dataset</a>'
    )
    unconfined = [v.root for t in tasks for v in t.trees if v.tree.sandbox == "none"]
    warn = (
        [f'<p class="warn"><b>{len(unconfined)} tree(s) were made WITHOUT a sandbox</b> (agent.sandbox: none): '
         "the Teacher's commands and the graded code ran unconfined, so their scores are not protected "
         "(docs/security.md).</p>"]
        if unconfined
        else []
    )  # fmt: skip
    body = [
        "<h1>sftree report</h1>",
        *warn,
        f"<p>{len(tasks)} tasks, {n_trees} trees, {n_nodes} Teacher nodes, {n_sel} selected paths, "
        f"{stats.records if stats else 0} SFT records. {nav}</p>",
        '<p class="muted">Hover a tree node for its score and tokens; click it for the full breakdown (Select '
        "breakdown of every dispatch from it, and the metrics of the edge that made it).</p>",
    ]
    body += [task_section(t) for t in tasks]
    body.append(dataset_section(stats))
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>sftree report</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>'
        f'<body><main>{"".join(body)}</main><div id="details"></div><script>{JS}</script></body></html>\n'
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", required=True, help="the workflow's results folder")
    parser.add_argument("--out", required=True, help="report.html to write")


def run(args: argparse.Namespace) -> int:
    results = Path(args.results)
    if not results.is_dir():
        raise InputError(f"results folder not found: {results}")
    page = render(results)
    write_text_atomic(args.out, page)
    log.info("report (%d KiB) -> %s", len(page.encode()) // 1024, args.out)
    return 0
