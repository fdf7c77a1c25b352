"""`sftree select-roots` end to end on small hand-made runs: picks, table, copies, bad input."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers.roots import MISSING, commit_of, make_run, read_table, tree_digest

from sftree.cli import main

RISING = [0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10, 10, 10, 10, 10]
# window 1: S0 = 0, S_inf = 10, c = score / 10 -> early idx 0-8 (9), middle 9-12 (4), late 13-19 (7)
# quotas for 6 roots: 1/3/2 -> early pos 4; middle pos 0, 2, 3; late pos 1, 5
RISING_PICKS = {5: "early", 10: "middle", 12: "middle", 13: "middle", 15: "late", 19: "late"}  # global index


def select(tmp_path, snaps, direction="maximize", *extra, task=None):
    out, table, plot = (
        tmp_path / "out" / "roots",
        tmp_path / "out" / "stages.tsv",
        tmp_path / "out" / "stages.svg",
    )
    argv = [
        "select-roots",
        "--snapshots",
        str(snaps),
        "--out",
        str(out),
        "--table",
        str(table),
        "--plot",
        str(plot),
        "--direction",
        direction,
        *extra,
    ]
    if task:
        argv += ["--task", task]
    return main(argv), out, table, plot


def chosen(out):
    result = {}
    for d in sorted(os.listdir(out)):
        meta = json.loads((out / d / "metadata.json").read_text())
        result[int(d.split("-")[1])] = meta
    return result


def test_rising_curve(tmp_path):
    snaps = tmp_path / "run" / "circle_packing"
    make_run(snaps, RISING)
    before = tree_digest(snaps)
    rc, out, table, plot = select(tmp_path, snaps, "maximize", "--num-roots", "6", "--smooth-window", "1")
    assert rc == 0
    roots = chosen(out)
    assert {k: m["stage"] for k, m in roots.items()} == RISING_PICKS
    m = roots[10]
    assert (m["score"], m["selection_reason"], m["task"], m["direction"]) == (
        5,
        "quota",
        "circle_packing",
        "maximize",
    )
    assert m["commit_hash"] == commit_of(10) and m["eval_ok"] is True  # original fields kept
    assert (
        out / f"eval-000010-agent-2-{commit_of(10)[:12]}" / "code" / "solution.py"
    ).read_text() == "X = 9\n"
    rows = read_table(table)
    assert len(rows) == 20 and rows[9]["gain_ratio"] == "0.5" and rows[9]["stage"] == "middle"
    assert (
        rows[12]["smooth_score"] == "8.0"
        and rows[12]["selected"] == "true"
        and rows[12]["stage_method"] == "gain"
    )
    assert [r["global_index"] for r in rows if r["selected"] == "true"] == [
        str(i) for i in sorted(RISING_PICKS)
    ]
    assert plot.read_text().startswith("<svg") and "chosen roots (6)" in plot.read_text()
    assert tree_digest(snaps) == before


def test_minimize_mirrors_maximize(tmp_path):
    snaps = tmp_path / "tsp"
    make_run(snaps, [100 - s for s in RISING])
    rc, out, table, _ = select(tmp_path, snaps, "minimize", "--num-roots", "6", "--smooth-window", "1")
    assert rc == 0
    assert {k: m["stage"] for k, m in chosen(out).items()} == RISING_PICKS
    rows = read_table(table)
    assert rows[12]["smooth_score"] == "92.0"  # table scores stay in the task's own units
    assert chosen(out)[10]["score"] == 95 and chosen(out)[10]["direction"] == "minimize"


def test_falling_curve_uses_time_fallback_with_default_window(tmp_path):
    snaps = tmp_path / "t"
    make_run(snaps, [10 - i for i in range(10)])  # N=10: 1 early, 4 middle, 5 late
    rc, out, table, _ = select(tmp_path, snaps, "maximize", "--num-roots", "6")
    assert rc == 0
    # early pos 0; middle (idx 2-5) pos 0, 2, 3; late (idx 6-10) pos 1, 3
    assert {k: m["stage"] for k, m in chosen(out).items()} == {
        1: "early",
        2: "middle",
        4: "middle",
        5: "middle",
        7: "late",
        9: "late",
    }
    rows = read_table(table)
    assert {r["stage_method"] for r in rows} == {"time"} and {r["gain_ratio"] for r in rows} == {""}
    # smoothed (window 5) first value: mean(10, 9, 8)
    assert float(rows[0]["smooth_score"]) == 9.0


def test_missing_scores_filled_from_earlier_then_later(tmp_path):
    snaps = tmp_path / "t"
    make_run(snaps, [None, MISSING, 3.0, None, 5.0, None])
    rc, _, table, _ = select(tmp_path, snaps, "maximize", "--num-roots", "2", "--smooth-window", "1")
    assert rc == 0
    rows = read_table(table)
    assert [r["score"] for r in rows] == ["", "", "3.0", "", "5.0", ""]
    assert [r["score_for_stage"] for r in rows] == ["3.0", "3.0", "3.0", "3.0", "5.0", "5.0"]
    assert [r["eval_ok"] for r in rows] == ["false", "false", "true", "false", "true", "false"]
    assert [r["selected"] for r in rows].count("true") == 2  # only the two eval_ok snapshots


def test_short_middle_refilled_from_late_then_early(tmp_path):
    # window 1; 8 early (0), 1 middle (7), 3 late (10): S_inf = mean of last ceil(12/5)=3 = 10
    snaps = tmp_path / "t"
    make_run(snaps, [0] * 8 + [7] + [10] * 3)
    rc, out, table, _ = select(tmp_path, snaps, "maximize", "--num-roots", "6", "--smooth-window", "1")
    assert rc == 0
    got = {k: (m["stage"], m["selection_reason"]) for k, m in chosen(out).items()}
    assert got == {
        5: ("early", "quota"),
        9: ("middle", "quota"),
        10: ("late", "quota"),
        12: ("late", "quota"),
        11: ("late", "refill:middle"),
        4: ("early", "refill:middle"),
    }
    reasons = {r["global_index"]: r["selection_reason"] for r in read_table(table)}
    assert reasons["11"] == "refill:middle" and reasons["1"] == ""


def test_fewer_eligible_than_num_roots_and_pending_skipped(tmp_path, caplog):
    snaps = tmp_path / "t"
    make_run(snaps, [0, 1, 2, 3, 4, 5], eval_ok=[True, False, True, True, True, True], pending=(5,))
    caplog.set_level("INFO")
    rc, out, table, _ = select(tmp_path, snaps, "maximize", "--smooth-window", "1")
    assert rc == 0
    # candidates 0..4: S0 = 0, S_inf = 4 -> c = 0, .25, .5, .75, 1; index 2 (score 1) is eval_ok false
    assert {k: m["stage"] for k, m in chosen(out).items()} == {
        1: "early",
        3: "middle",
        4: "middle",
        5: "late",
    }
    assert len(read_table(table)) == 5  # the pending snapshot is not a candidate
    text = caplog.text
    assert "6 snapshots read (5 candidates, 1 pending skipped)" in text and "only 4 eligible" in text


def test_ties_in_scores_keep_global_order(tmp_path):
    # equal scores everywhere: S_inf == S0 -> time fallback; picks are by global order only
    snaps = tmp_path / "t"
    make_run(snaps, [2.5] * 10, start=101)
    rc, out, _, _ = select(tmp_path, snaps, "maximize", "--num-roots", "3")
    assert rc == 0
    # quotas 0/2/1 (early-middle tie at .5 goes to middle); middle idx 1-4 pos 1, 3; late idx 5-9 pos 2
    assert {k: m["stage"] for k, m in chosen(out).items()} == {103: "middle", 105: "middle", 108: "late"}


@pytest.mark.parametrize("num_roots, counts", [(7, (1, 4, 2)), (10, (2, 5, 3)), (31, (5, 16, 10))])
def test_quotas_other_than_30(tmp_path, num_roots, counts):
    snaps = tmp_path / "t"
    make_run(snaps, [float(i) for i in range(100)])  # linear rise: plenty in every stage
    rc, out, _, _ = select(tmp_path, snaps, "maximize", "--num-roots", str(num_roots))
    assert rc == 0
    stages = [m["stage"] for m in chosen(out).values()]
    assert (stages.count("early"), stages.count("middle"), stages.count("late")) == counts
    assert {m["selection_reason"] for m in chosen(out).values()} == {"quota"}


def test_task_folder_layout_short_hash_and_field_match(tmp_path):
    root = tmp_path / "all"
    folders = make_run(root / "tsp", [5.0, 4.0, 3.0, 2.0])
    # attempt named by a short hash; another named arbitrarily but holding the commit_hash field
    a0 = folders[0] / "shared" / "attempts"
    os.rename(a0 / f"{commit_of(1)}.json", a0 / f"{commit_of(1)[:8]}.json")
    a1 = folders[1] / "shared" / "attempts"
    os.rename(a1 / f"{commit_of(2)}.json", a1 / "attempt-two.json")
    rc, out, table, _ = select(tmp_path, root, "minimize", "--num-roots", "4", task="tsp")
    assert rc == 0
    assert [r["score"] for r in read_table(table)] == ["5.0", "4.0", "3.0", "2.0"]
    assert all(m["task"] == "tsp" for m in chosen(out).values())


def test_hardlink_mode_is_self_contained_and_never_touches_the_input(tmp_path):
    from sftree.records.root import verify_root
    from sftree.runtime.store import TreeStore

    snaps = tmp_path / "t"
    folders = make_run(snaps, RISING)
    before = tree_digest(snaps)
    rc, out, _, _ = select(tmp_path, snaps, "maximize", "--num-roots", "6", "--link", "hardlink")
    assert rc == 0
    name = folders[9].name  # global index 10 is chosen (see RISING_PICKS)
    assert (
        os.stat(out / name / "code" / "solution.py").st_ino
        == os.stat(folders[9] / "code" / "solution.py").st_ino
    )
    assert os.stat(out / name / "metadata.json").st_ino != os.stat(folders[9] / "metadata.json").st_ino
    assert "stage" not in json.loads((folders[9] / "metadata.json").read_text())
    assert "root_links" not in json.loads((out / name / "metadata.json").read_text())
    assert tree_digest(snaps) == before
    # self-contained: the Student run may go away, the root still seeds a tree
    digest = tree_digest(out / name)
    shutil.rmtree(snaps)
    assert tree_digest(out / name) == digest
    verify_root(out / name)
    _, state = TreeStore.create(tmp_path / "tree", out / name, {})
    assert state.code_commit


def test_default_symlinks_roots_and_explore_never_writes_through(tmp_path):
    """By default a root refers to its snapshot: code/ and shared/ are symlinks to the snapshot's (absolute),
    metadata.json is a new file that records the snapshot's fingerprints, and seeding a tree, forking it and
    committing an edit leave the snapshot byte for byte as it was. A tree seeds from it exactly as from a
    hard-linked or copied root."""
    from sftree.records.root import verify_root
    from sftree.roots.select_roots import Linker
    from sftree.runtime.store import TreeStore

    snaps = tmp_path / "t"
    folders = make_run(snaps, RISING)
    src = folders[9]
    (src / "shared" / "notes" / "n.md").write_text("a Student note\n")
    os.symlink("../metadata.json", src / "code" / "meta-link")  # stays a symlink, never followed
    before = tree_digest(snaps)
    rc, out, _, _ = select(tmp_path, snaps, "maximize", "--num-roots", "6")
    assert rc == 0
    root = out / src.name
    assert sorted(os.listdir(root)) == ["code", "metadata.json", "shared"]
    for entry in ("code", "shared"):
        assert os.readlink(root / entry) == str(src.resolve() / entry)
    assert not os.path.islink(root / "metadata.json")
    assert os.stat(root / "metadata.json").st_ino != os.stat(src / "metadata.json").st_ino
    meta = json.loads((root / "metadata.json").read_text())
    assert meta["stage"] == "middle" and meta["root_links"]["source"] == str(src.resolve())
    # the fingerprints: each linked entry and what lies directly in it, nothing deeper
    assert sorted(meta["root_links"]["entries"]) == [
        "code", "code/meta-link", "code/solution.py", "shared", "shared/attempts", "shared/notes"
    ]  # fmt: skip
    verify_root(root)
    store, state = TreeStore.create(tmp_path / "tree", root, {})
    ws = store.fork(state, "e1")
    for path in (ws.root / "solution.py", ws.knowledge_dir / "notes" / "n.md"):
        assert not os.path.islink(path)
        path.write_text("changed by the Teacher\n")
    ws.commit_code("edit")
    ws.commit_knowledge("edit")
    ws.close()
    assert tree_digest(snaps) == before
    verify_root(root)  # reading the snapshot through the links changed nothing it checks
    # hard-linked and copied roots seed the very same commits
    for mode in ("hardlink", "copy"):
        rc, out, _, _ = select(tmp_path, snaps, "maximize", "--num-roots", "6", "--link", mode)
        assert rc == 0 and not os.path.islink(out / src.name / "code")
        same = (
            os.stat(out / src.name / "code" / "solution.py").st_ino
            == os.stat(src / "code" / "solution.py").st_ino
        )
        assert same == (mode == "hardlink")
        _, other = TreeStore.create(tmp_path / f"tree-{mode}", out / src.name, {})
        assert (other.code_commit, other.knowledge_commit) == (state.code_commit, state.knowledge_commit)
    linker = Linker("auto", can_link=False, can_clone=False)  # cannot link (another filesystem): copies
    linker.place(str(src / "code" / "solution.py"), str(tmp_path / "copied.py"))
    assert linker.counts == {"hardlink": 0, "reflink": 0, "copy": 1}
    assert (tmp_path / "copied.py").read_bytes() == (src / "code" / "solution.py").read_bytes()
    assert tree_digest(snaps) == before


def test_rerun_replaces_old_output_completely(tmp_path):
    snaps = tmp_path / "t"
    make_run(snaps, RISING)
    select(tmp_path, snaps, "maximize", "--num-roots", "6")
    rc, out, _, _ = select(tmp_path, snaps, "maximize", "--num-roots", "2")
    assert rc == 0 and len(os.listdir(out)) == 2
    assert sorted(os.listdir(out.parent)) == ["roots", "stages.svg", "stages.tsv"]  # no temp leftovers


def _bad(tmp_path, name):
    snaps = tmp_path / name
    folders = make_run(snaps, [1.0, 2.0, 3.0, 4.0])
    return snaps, folders


def _corrupt_metadata_missing(f):
    os.remove(f[1] / "metadata.json")
    return f[1] / "metadata.json"


def _corrupt_metadata_json(f):
    (f[1] / "metadata.json").write_text("{not json")
    return f[1] / "metadata.json"


def _corrupt_metadata_dir(f):
    os.remove(f[1] / "metadata.json")
    (f[1] / "metadata.json").mkdir()
    return f[1] / "metadata.json"


def _corrupt_attempt_json(f):
    p = f[2] / "shared" / "attempts" / f"{commit_of(3)}.json"
    p.write_text('{"score": 1.0,')
    return p


def _corrupt_attempt_missing(f):
    os.remove(f[2] / "shared" / "attempts" / f"{commit_of(3)}.json")
    return f[2] / "shared" / "attempts"


def _corrupt_name(f):
    bad = f[3].parent / "eval-00x004-agent-1-abcdef123456"
    os.rename(f[3], bad)
    return bad


def _corrupt_duplicate(f):
    dup = f[3].parent / "eval-000002-agent-9-abcdef123456"
    os.rename(f[3], dup)
    return dup


def _corrupt_score(f):
    p = f[0] / "shared" / "attempts" / f"{commit_of(1)}.json"
    rec = json.loads(p.read_text())
    rec["score"] = "2.5"
    p.write_text(json.dumps(rec))
    return p


def _corrupt_eval_ok(f):
    p = f[0] / "metadata.json"
    meta = json.loads(p.read_text())
    meta["eval_ok"] = "yes"
    p.write_text(json.dumps(meta))
    return p


@pytest.mark.parametrize(
    "corrupt, words",
    [
        (_corrupt_metadata_missing, "metadata.json not found"),
        (_corrupt_metadata_json, "is not valid JSON"),
        (_corrupt_metadata_dir, "cannot read metadata.json"),
        (_corrupt_attempt_json, "attempt record"),
        (_corrupt_attempt_missing, "no attempt record for commit"),
        (_corrupt_name, "does not parse"),
        (_corrupt_duplicate, "duplicate global index 2"),
        (_corrupt_score, "score must be a number or null"),
        (_corrupt_eval_ok, "eval_ok must be true or false"),
    ],
)
def test_bad_input_names_the_path_and_writes_nothing(tmp_path, capsys, corrupt, words):
    snaps, folders = _bad(tmp_path, "t")
    culprit = corrupt(folders)
    before = tree_digest(snaps)
    rc, out, table, plot = select(tmp_path, snaps, "maximize")
    err = capsys.readouterr().err
    assert rc == 2 and words in err and str(culprit) in err, err
    assert not out.exists() and not table.exists() and not plot.exists()
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []
    assert tree_digest(snaps) == before


def test_bad_input_keeps_the_previous_output(tmp_path, capsys):
    snaps, folders = _bad(tmp_path, "t")
    # full copies: hard-linked roots share their files with the snapshot, so the in-place edit below would
    # show through them (a Coral snapshot is written once; docs/select_roots.md)
    assert select(tmp_path, snaps, "maximize", "--link", "copy")[0] == 0
    old = tree_digest(tmp_path / "out")
    _corrupt_attempt_json(folders)
    assert select(tmp_path, snaps, "maximize")[0] == 2
    assert tree_digest(tmp_path / "out") == old


def test_empty_task_and_no_usable_score_name_the_task(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert select(tmp_path, tmp_path / "empty", "maximize", task="circle_packing")[0] == 2
    err = capsys.readouterr().err
    assert (
        "task 'circle_packing'" in err
        and "no eval-* snapshot folders" in err
        and str(tmp_path / "empty") in err
    )
    make_run(tmp_path / "nulls" / "tsp", [None, None, MISSING])
    assert select(tmp_path, tmp_path / "nulls", "minimize", task="tsp")[0] == 2
    err = capsys.readouterr().err
    assert "task 'tsp'" in err and "numeric score" in err
    make_run(tmp_path / "pend", [1.0, 2.0], pending=(0, 1))
    assert select(tmp_path, tmp_path / "pend", "minimize")[0] == 2
    assert "2 pending" in capsys.readouterr().err


def test_console_script_exit_status_and_message(tmp_path):
    snaps = tmp_path / "t"
    make_run(snaps, [1.0, 2.0])
    os.remove(snaps / os.listdir(snaps)[0] / "metadata.json")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sftree",
            "select-roots",
            "--snapshots",
            str(snaps),
            "--out",
            str(tmp_path / "o"),
            "--table",
            str(tmp_path / "s.tsv"),
            "--direction",
            "maximize",
        ],
        capture_output=True,
        text=True,
    )
    assert (
        proc.returncode == 2 and "metadata.json not found" in proc.stderr and "Traceback" not in proc.stderr
    )


def test_eval_ok_without_a_score_and_non_finite_scores_are_never_roots(tmp_path, caplog):
    snaps = tmp_path / "t"
    folders = make_run(snaps, [1.0, MISSING, 3.0, 4.0], eval_ok=[True, True, True, True])
    p = folders[2] / "shared" / "attempts" / f"{commit_of(3)}.json"
    p.write_text(p.read_text().replace('"score": 3.0', '"score": NaN'))
    caplog.set_level("INFO")
    rc, out, table, _ = select(tmp_path, snaps, "maximize", "--smooth-window", "1")
    assert rc == 0 and sorted(chosen(out)) == [1, 4]
    rows = read_table(table)
    assert [r["score"] for r in rows] == ["1.0", "", "", "4.0"]
    assert [r["score_for_stage"] for r in rows] == ["1.0", "1.0", "1.0", "4.0"]
    assert "1 non-finite score(s) treated as missing" in caplog.text


def test_parallel_read_gives_the_same_scan(tmp_path, monkeypatch):
    from sftree.roots import snapshots

    make_run(tmp_path / "t", [float(i % 7) for i in range(60)], pending=(5, 17))
    serial = snapshots.scan(tmp_path / "t", "t", jobs=1)
    monkeypatch.setattr(snapshots, "PARALLEL_MIN", 8)
    parallel = snapshots.scan(tmp_path / "t", "t", jobs=2)
    assert parallel.snapshots == serial.snapshots and parallel.pending == serial.pending
    assert len(serial.snapshots) == 58
