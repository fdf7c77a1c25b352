"""Knowledge actions on the real OpenCode (issue 31, item 6): every tool OpenCode 1.18.33 offers that reads or
writes under the knowledge folders makes the turn a knowledge action (DESIGN.md), and the same tool on code does
not. The scripted Teacher calls each tool through the real OpenCode, in its sandbox; the flag checked is the one
the tree keeps: the turn's `knowledge` (TurnOutcome.knowledge, tree.json's turns) and each call's in steps.jsonl.

One edge per tool: turn 1 calls it on knowledge paths, turn 2 on code paths. `apply_patch` is offered instead of
`edit`/`write` for a GPT-style Student id (Coral's default, openai/gpt-5): those edges run with that id.
"""

from __future__ import annotations

import json
import shutil

import helpers.scripted as scripted_mod
import pytest
from helpers.runtime import opencode_binary
from helpers.scripted import Scripted, bash, edit_solution, make_base

OPENCODE, WHY = opencode_binary()

pytestmark = [
    pytest.mark.opencode,
    pytest.mark.slow,
    pytest.mark.skipif(OPENCODE is None, reason=f"opencode binary missing: {WHY}"),
]
RUN = "/workspace/results/circle_packing"  # agent.run_dir's default: the worktree is agents/agent-1 in it
SHARED = f"{RUN}/.coral/public"
SKILL = "---\nname: fast\ndescription: Faster packing passes\n---\nTry GROW_PASSES = 1.\n"


def patch(*body: str) -> tuple[str, dict]:
    return ("apply_patch", {"patchText": "\n".join(["*** Begin Patch", *body, "*** End Patch"])})


# tool -> (Student id, turn 1: knowledge calls, turn 2: code calls); each call is a step of its own.
# Expected per call: True in turn 1 unless listed in MIXED, False in turn 2.
EDGES = {
    "read": (None,
             [("read", {"filePath": ".opencode/notes/student.md"}),
              ("read", {"filePath": f"{SHARED}/notes/student.md"}),
              ("read", {"filePath": "./src/../.opencode/notes"})],
             [("read", {"filePath": "solution.py"})]),
    "write": (None,
              [("write", {"filePath": ".opencode/notes/new.md", "content": "a new note\n"})],
              [("write", {"filePath": "scratch.md", "content": "not a note\n"})]),
    "edit": (None,
             [("edit", {"filePath": ".opencode/notes/student.md", "oldString": "did not help",
                        "newString": "did not help either"})],
             [edit_solution()]),
    "glob": (None,
             [("glob", {"pattern": ".opencode/notes/**"}), ("glob", {"pattern": "*", "path": ".opencode/notes"}),
              ("glob", {"pattern": "**/*.md", "path": SHARED})],
             [("glob", {"pattern": "**/*.py"})]),
    "grep": (None,
             [("grep", {"pattern": "ROWS", "path": ".opencode/notes"}),
              ("grep", {"pattern": "ROWS", "include": "*.md", "path": f"{SHARED}/notes"})],
             [("grep", {"pattern": ".opencode/notes", "include": "*.py"})]),  # a regex over contents, no path
    "skill": (None,
              [("skill", {"name": "fast"})],  # the shared skill the root snapshot holds
              [("skill", {"name": "nosuch"})]),  # no such skill: a tool error, it read nothing
    "bash": (None,
             [bash("ls -la .opencode; true"), bash("cat ../../.coral/public/notes/student.md"),
              bash("coral notes")],
             [bash("ls -la; python3 -c 'print(1)'"), bash('coral eval -m "as .opencode/notes/student.md says"')]),
    "apply_patch": ("openai/gpt-5",
                    [patch("*** Add File: .opencode/notes/x.md", "+hello"),
                     patch("*** Update File: .opencode/notes/x.md", "*** Move to: .opencode/notes/y.md", "@@",
                           "-hello", "+bye"),
                     patch("*** Delete File: .opencode/notes/y.md"),
                     patch(f"*** Add File: {SHARED}/notes/abs.md", "+absolute")],
                    [patch("*** Add File: draft.md", "+draft"),
                     patch("*** Update File: draft.md", "*** Move to: draft2.md", "@@", "-draft", "+draft 2")]),
    "apply_patch_move": ("openai/gpt-5",  # the case: code moved into the notes
                         [patch("*** Add File: draft.md", "+draft"),
                          patch("*** Update File: draft.md", "*** Move to: .opencode/notes/draft.md", "@@",
                                "-draft", "+a note now")],
                         [patch("*** Update File: solution.py", "@@", "-GROW_PASSES = 0", "+GROW_PASSES = 1")]),
}  # fmt: skip
MIXED = {"apply_patch_move": [False, True]}  # turn 1's per-call flags where not all True
ERRORS = {("skill", 2)}  # (edge, turn) whose calls fail as tools on purpose


def with_skill(real_make_root):
    def make_root(tmp):
        root = real_make_root(tmp)
        (root / "shared" / "skills" / "fast").mkdir(parents=True)
        (root / "shared" / "skills" / "fast" / "SKILL.md").write_text(SKILL)
        return root

    return make_root


@pytest.fixture(scope="module")
def grown():
    """Every edge of EDGES, run once: {edge: (EdgeResult, its step records, the tree folder)}."""
    base = make_base()
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scripted_mod, "make_root", with_skill(scripted_mod.make_root))
        for model in (None, "openai/gpt-5"):
            edges = {e: v for e, v in EDGES.items() if v[0] == model}
            script = {
                (e, t): [[c] for c in calls] for e, v in edges.items() for t, calls in ((1, v[1]), (2, v[2]))
            }
            folder = base / ("gpt" if model else "default")
            folder.mkdir()
            agent = {"backend": "opencode", "max_steps_per_turn": 8, "turn_timeout": 240}
            s = Scripted(folder, script, agent={**agent, **({"student_model": model} if model else {})})
            try:
                for e in edges:
                    out[e] = (s.edge(e), s.steps(e), s.tree_dir)
            finally:
                s.close()
    yield out
    shutil.rmtree(base, ignore_errors=True)


def calls_of(steps: list[dict], turn: int) -> list[tuple[str, dict, dict]]:
    """(tool, arguments, tool result) of each call the Teacher made in `turn`, in order."""
    out = []
    for s in steps:
        if s["turn"] != turn or s["kind"] not in ("agent", "nudge"):
            continue
        for c, res in zip(
            (s.get("response") or {}).get("tool_calls") or [], s.get("tool_results") or [], strict=True
        ):
            out.append((c["function"]["name"], json.loads(c["function"]["arguments"]), res))
    return out


@pytest.mark.parametrize("edge", list(EDGES))
def test_a_tool_on_the_knowledge_is_a_knowledge_action_and_on_code_it_is_not(grown, edge):
    r, steps, _ = grown[edge]
    model, first, second = EDGES[edge]
    for turn, planned in ((1, first), (2, second)):
        made = calls_of(steps, turn)
        assert [(n, a) for n, a, _ in made] == [tuple(c) for c in planned], (turn, made)
        for n, a, res in made:  # each call really ran (else the flag would say nothing of the tool)
            assert res["error"] is ((edge, turn) in ERRORS), (n, a, res["content"][:500])
    flags = [res["knowledge"] for _, _, res in calls_of(steps, 1)]
    assert flags == MIXED.get(edge, [True] * len(first)), flags
    assert [res["knowledge"] for _, _, res in calls_of(steps, 2)] == [False] * len(second)
    t1, t2 = r.turns
    assert t1.knowledge is True and t2.knowledge is False, r.to_dict()
    if model:  # the tool set OpenCode offers for that id (apply_patch, no edit/write)
        tools = [t["function"]["name"] for t in steps[0]["request"]["tools"]]
        assert "apply_patch" in tools and "edit" not in tools and "write" not in tools, tools
    if edge == "bash":
        assert t2.ended == "eval", r.to_dict()  # the eval ran; its message names a note but reads none
    if edge == "skill":
        assert "Try GROW_PASSES = 1." in calls_of(steps, 1)[0][2]["content"]


def test_the_notes_apply_patch_wrote_are_the_edges_knowledge_change(grown):
    """What the flagged calls did is real: the edge's knowledge diff holds the note moved in from code."""
    r, _, tree_dir = grown["apply_patch_move"]
    diff = (tree_dir / r.knowledge_diff).read_text()
    assert "notes/draft.md" in diff and "a note now" in diff, diff
