"""Hand-built search trees for the tests of search/mcts.py: EdgeResults as run_edge reports them, one step of
ask/begin/tell, the three root edges of the policy tests (no runtime)."""

from sftree.runtime.workspace import NodeState
from sftree.search import mcts
from sftree.search import tree as treemod
from sftree.search.edge import EdgeResult, TurnResult
from sftree.settings import SearchSettings


def result(
    eid, s1, s2, *, calls=10, errors=0, tokens=1000, knowledge=True, parent=None, direction="maximize"
):
    """An EdgeResult as run_edge reports it: per-turn scores, tool calls, context length."""
    from sftree.records.scores import best_of, regressed_rate

    turns = [
        TurnResult(i + 1, s, "improved" if s is not None else None, None, 3, calls // 2 if i == 0 else calls - calls // 2,
                   errors // 2 if i == 0 else errors - errors // 2, knowledge, tokens // 2 * (i + 1),
                   "eval" if s is not None else "no_eval")
        for i, s in enumerate((s1, s2))
    ]  # fmt: skip
    return EdgeResult(
        edge_id=eid, turns=turns, score=best_of([s1, s2], direction), valid=s1 is not None and s2 is not None,
        steps=6, tool_calls=calls, tool_errors=errors, tool_error_rate=errors / calls if calls else 0.0,
        tokens=tokens, knowledge=knowledge, regressed_rate=regressed_rate(parent, [s1, s2], direction),
        child_state=NodeState(f"c-{eid}", f"k-{eid}", f"sessions/{eid}.json"), transcript=f"edges/{eid}/steps.jsonl",
        code_diff="", knowledge_diff="", error=None, wall_s=0.1, evals=2,
    )  # fmt: skip


def search_params(**over) -> SearchSettings:
    """The config's `search:` (the schema's defaults) with `over` set."""
    from sftree.settings import section_settings

    return section_settings(SearchSettings, over)


def new_tree(direction="maximize", root_score=1.0, **params):
    p = search_params(**params)
    return treemod.Tree.new("t", "eval-000001-agent-1-abc", direction, p, root_score, {"code_commit": "c0",
                            "knowledge_commit": "k0", "session": None}, 10)  # fmt: skip


def step(tree, exp, s1, s2, **kw):
    d = mcts.begin(tree, exp)
    return mcts.tell(tree, d, result(d.edge, s1, s2, parent=d.parent_score, direction=tree.direction, **kw))


def grow_root(tree):
    """Three root edges with hand-computed soft scores (see test_search_policy.py:test_select_breakdown)."""
    exps = mcts.ask(tree, 8)
    assert [(e.node, e.slot, e.attempt, e.exempt, e.depth) for e in exps] == [
        ("n0", 0, 1, False, 1), ("n0", 1, 1, False, 1), ("n0", 2, 1, False, 1)]  # fmt: skip
    assert exps[0].select == {"node": "n0", "score_rank": 0.5, "best_rank": 0.5, "process": 0.0, "Q": 0.35,
                              "T": 0.5, "select": 0.6}  # fmt: skip
    ds = [mcts.begin(tree, e) for e in exps]
    assert mcts.ask(tree, 8) == []  # virtual visits: all three root directions are in flight
    e1 = mcts.tell(tree, ds[0], result("e1", 1.5, 2.0, tokens=1000, parent=1.0))
    e2 = mcts.tell(tree, ds[1], result("e2", 0.8, 0.5, errors=1, tokens=3000, knowledge=False, parent=1.0))
    e3 = mcts.tell(tree, ds[2], result("e3", 1.0, 1.2, calls=0, tokens=2000, parent=1.0))
    return e1, e2, e3
