"""`sftree import-coral` on the runs of upstream Coral: several islands (`.coral/islands/<id>/`, one hub each) and
budget classes (`metadata.budget_class`: only `real` attempts are the run's scores).

The fixtures are built by tests/helpers/coralrun.py in the layout upstream's writers make (`hub/_island.py`
`island_root`, `hub/checkpoint.py`, `hooks/post_commit.py` `submit_eval`, `grader/daemon.py` `_grade_one`).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers.coralrun import Spec, build_run, git, record_bytes

from sftree.roots import import_coral as ic
from sftree.roots.import_coral import run_import
from sftree.roots.snapshots import scan


def snapshots(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.name.startswith("eval-"))


def meta(snap: Path) -> dict:
    return json.loads((snap / "metadata.json").read_text())


def island_specs() -> list[Spec]:
    """Two islands, submissions interleaved; agent-1 works on both (it migrated), each island writes a note of
    the same name with its own text; tune evals, grader errors, a crash (real), one real attempt pending."""
    plan = [  # island, agent, status, score, budget class
        ("0", "agent-1", "improved", 0.50, "real"),
        ("1", "agent-2", "improved", 0.40, "real"),
        ("0", "agent-1", "improved", 0.90, "tune"),  # a dev-split eval: never a score of the run
        ("1", "agent-2", "timeout", None, "grader_error"),  # the grader timed out
        ("0", "agent-3", "crashed", None, "real"),  # the code crashed: stays real
        ("1", "agent-1", "improved", 0.60, "real"),  # agent-1 migrated to island 1
        ("0", "agent-3", "crashed", None, "grader_error"),  # the grader raised
        ("1", "agent-2", "regressed", 0.55, "real"),
        ("0", "agent-1", "improved", 0.70, "real"),
        ("1", "agent-1", "improved", 0.95, "tune"),
        ("0", "agent-3", "pending", None, "real"),
    ]
    specs = []
    for i, (island, agent, status, score, budget) in enumerate(plan):
        public = {f"notes/{agent}.md": f"# island {island}, after attempt {i}\n".encode()}
        if i < 2:
            public[f"skills/sweep-{island}/SKILL.md"] = f"---\nname: sweep of island {island}\n---\n".encode()
        files = {"solution.py": f"VALUE = {i}\n".encode()}
        specs.append(
            Spec(agent, files, status, score, public, title=f"attempt {i}", budget=budget, island=island)
        )
    return specs


def test_a_multi_island_run_imports_every_real_attempt_of_every_island_once(tmp_path):
    specs = island_specs()
    built = build_run(tmp_path / "run", specs)
    assert (built.run / ".coral/islands/0/attempts").is_dir() and not (
        built.run / ".coral/public/attempts"
    ).exists()
    out = tmp_path / "snaps" / "demo"
    result = run_import(built.run, out)
    assert result.problems == []
    real = [i for i, s in enumerate(specs) if s.budget == "real"]
    snaps = snapshots(out)
    assert len(snaps) == len(real) == 7
    per_island: dict[str, int] = {}
    graded: dict[str, int] = {}
    for i, s in enumerate(specs):  # each hub's eval counter counts every graded attempt, whatever its class
        if s.status != "pending":
            graded[s.island] = graded.get(s.island, 0) + 1
        if s.budget == "real":
            per_island[built.commits[i]] = graded[s.island] if s.status != "pending" else None
    for snap, i in zip(snaps, real, strict=True):
        spec, rec, m = specs[i], built.records[i], meta(snap)
        # once, with its island, in the global order of submission over all islands
        assert (m["commit_hash"], m["island_id"], m["agent_id"]) == (
            built.commits[i],
            spec.island,
            spec.agent,
        )
        assert m["coral_import"]["record"] == f".coral/islands/{spec.island}/attempts/{built.commits[i]}.json"
        assert m.get("eval_count") == per_island[built.commits[i]]
        # its score is its own record's; its knowledge is its own island's checkpoint
        own = json.loads((snap / "shared/attempts" / f"{built.commits[i]}.json").read_text())
        assert own == rec and own["metadata"]["island_id"] == spec.island
        hub = built.run / ".coral/islands" / spec.island
        note = git("show", f"{built.checkpoints[i]}:notes/{spec.agent}.md", cwd=hub).encode()
        assert (snap / "shared/notes" / f"{spec.agent}.md").read_bytes() == note
        assert f"# island {spec.island}," in note.decode()
        assert [p.name for p in (snap / "shared/skills").iterdir()] == [f"sweep-{spec.island}"]
        # the other island's attempts are not in this island's knowledge
        others = {built.commits[j] for j, s in enumerate(specs) if s.island != spec.island}
        assert not others & {p.stem for p in (snap / "shared/attempts").iterdir()}
    report = json.loads((out / ic.REPORT_JSON).read_text())
    assert report["budget_classes"] == {"real": 7, "tune": 2, "grader_error": 2}
    assert [h["island_id"] for h in report["coral"]["islands"]] == ["0", "1"]
    assert report["counts"]["records"] == 11 and report["counts"]["snapshots"] == 7
    assert report["counts"]["pending"] == 1
    rows = [r.split("\t") for r in (out / ic.REPORT_TSV).read_text().splitlines()]
    assert rows[0][-1] == "island_id"
    left = {r[2]: r[7] for r in rows[1:] if r[0] == ""}
    assert left == {
        built.commits[i]: f"left out: budget_class {s.budget}"
        for i, s in enumerate(specs)
        if s.budget != "real"
    }
    # section 2 reads them: the scores are the real ones only
    s = scan(out, "demo")
    assert sorted(x.score for x in s.snapshots if x.score is not None) == [0.4, 0.5, 0.55, 0.6, 0.7]
    # a rerun changes nothing
    again = run_import(built.run, out)
    assert again.actions["up_to_date"] == 7 and again.actions["written"] == 0


def test_an_agent_id_and_a_commit_seen_on_two_islands_are_kept_apart(tmp_path):
    """A record Coral finds in two hubs (the same commit id in both: an attempt carried over on migration) is
    two attempts, each with its own island's knowledge and record."""
    specs = island_specs()[:6]
    built = build_run(tmp_path / "run", specs)
    # island 1 also holds island 0's first attempt, checkpointed there (its own knowledge at that time)
    hub1 = built.run / ".coral/islands/1"
    rec = dict(built.records[0], metadata={"island_id": "1", "budget_class": "real"})
    rec["shared_state_hash"] = built.checkpoints[5]
    rec["timestamp"] = built.records[5]["timestamp"].replace("09:02:30", "09:02:31")
    (hub1 / "attempts" / f"{rec['commit_hash']}.json").write_bytes(record_bytes(rec))
    out = tmp_path / "snaps" / "demo"
    result = run_import(built.run, out)
    assert result.problems == []
    twice = [meta(s) for s in snapshots(out) if meta(s)["commit_hash"] == built.commits[0]]
    assert sorted(m["island_id"] for m in twice) == ["0", "1"]
    assert len({m["coral_import"]["record"] for m in twice}) == 2
    state = json.loads((out / ic.STATE_DIR / "state.json").read_text())["items"]
    assert f"0/{built.commits[0]}" in state and f"1/{built.commits[0]}" in state


def test_budget_classes_in_a_single_hub_run(tmp_path):
    """One hub (.coral/public): tune and grader_error attempts get no snapshot; a run written before budget
    classes existed (no metadata) imports every attempt, as before."""
    specs = [
        Spec("agent-1", {"a.py": b"1\n"}, "improved", 0.5, budget="real"),
        Spec("agent-1", {"a.py": b"2\n"}, "improved", 0.9, budget="tune"),
        Spec("agent-2", {"a.py": b"3\n"}, "crashed", None, budget="grader_error"),
        Spec("agent-2", {"a.py": b"4\n"}, "improved", 0.6, budget=None),  # before budget classes: real
    ]
    built = build_run(tmp_path / "run", specs)
    out = tmp_path / "snaps" / "demo"
    result = run_import(built.run, out)
    got = [meta(s) for s in snapshots(out)]
    assert [m["commit_hash"] for m in got] == [built.commits[0], built.commits[3]]
    assert all("island_id" not in m for m in got)
    assert [m["eval_count"] for m in got] == [1, 4]  # the hub's counter counts every graded attempt
    assert result.budget_classes == {"real": 2, "tune": 1, "grader_error": 1}
    cli = subprocess.run(
        ["sftree", "import-coral", str(built.run), "--out", str(tmp_path / "cli" / "demo")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    assert "left out (no score of the run): 1 tune, 1 grader_error" in cli.stderr


def test_an_attempt_pending_when_imported_then_a_grader_error_loses_its_snapshot(tmp_path):
    specs = [
        Spec("agent-1", {"a.py": b"1\n"}, "improved", 0.5),
        Spec("agent-1", {"a.py": b"2\n"}, "pending", None),
    ]
    built = build_run(tmp_path / "run", specs)
    out = tmp_path / "snaps" / "demo"
    run_import(built.run, out)
    assert len(snapshots(out)) == 2
    rec = dict(built.records[1], status="timeout", metadata={"budget_class": "grader_error"})
    rec["feedback"] = "Eval timed out after 60s."
    (built.run / ".coral/public/attempts" / f"{built.commits[1]}.json").write_bytes(record_bytes(rec))
    (built.run / ".coral/public/eval_count").write_text("2")
    result = run_import(built.run, out)
    assert [meta(s)["commit_hash"] for s in snapshots(out)] == [built.commits[0]]
    assert any("1 snapshot(s) removed" in n for n in result.notes)
    state = json.loads((out / ic.STATE_DIR / "state.json").read_text())["items"]
    assert built.commits[1] not in state


def test_select_roots_over_all_islands_by_default_or_per_island(tmp_path):
    """Section 2 runs over every island's snapshots in the global order by default; `--per-island` splits
    --num-roots over the islands and selects each from its own snapshots, so each island is represented."""
    specs = []
    for i in range(24):  # island 1 is small: over all islands together, it gets fewer roots than its share
        island = "1" if i % 6 == 5 else "0"
        score = 0.1 + 0.03 * i if island == "0" else 0.01 + 0.001 * i
        specs.append(
            Spec(f"agent-{island}", {"v.py": f"{i}\n".encode()}, "improved", round(score, 6), island=island)
        )
    built = build_run(tmp_path / "run", specs)
    out = tmp_path / "snaps" / "demo"
    run_import(built.run, out)
    from sftree.roots.select_roots import select, select_per_island

    s = scan(out, "demo")
    assert {x.island for x in s.snapshots} == {"0", "1"}
    together = select(s, "maximize", 6, 3).chosen
    per = select_per_island(s, "maximize", 6, 3)
    assert [r.snap.island for r in per.chosen].count("0") == 3 and len(per.chosen) == 6
    assert [r.snap.island for r in together].count("1") < 3 and len(together) == 6
    assert [r.snap.global_index for r in per.rows] == sorted(x.global_index for x in s.snapshots)
    cli = subprocess.run(
        ["sftree", "select-roots", "--snapshots", str(out), "--out", str(tmp_path / "roots"), "--table",
         str(tmp_path / "stages.tsv"), "--direction", "maximize", "--num-roots", "6", "--smooth-window", "3",
         "--per-island"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    roots = [json.loads((p / "metadata.json").read_text()) for p in (tmp_path / "roots").iterdir()]
    assert sorted(m["island_id"] for m in roots) == ["0", "0", "0", "1", "1", "1"]
