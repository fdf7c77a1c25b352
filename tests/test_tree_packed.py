"""The tree form (`export.tree_packed`, dataset/tree_packed.py): the selected paths' tokens packed as prefix trees, each
shared prefix once, with weights that make a line's weighted loss the path form's objective; hand-computed cases
(a path that is a prefix of another, two paths sharing edges, a token trained on one path and not another, parts
under a cap) and the export of the fixture tree under the Student."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from helpers.export import make_results
from test_export_student import QWEN, paths_of, student

from sftree.dataset.export import export_task
from sftree.dataset.tree_packed import (
    PackedTree,
    PathTokens,
    pack_paths,
    pack_records,
    path_tokens,
    split_parts,
)
from sftree.records.tree_packed import TreeLine, iter_tree_lines, line_problem, read_tree_stats


def P(ids: str, trained: str, name: str = "p") -> PathTokens:
    """A path from a string of one-digit ids and a mask string ('1': trained)."""
    return PathTokens(tuple(int(c) for c in ids), tuple(c == "1" for c in trained), {"id": name})


def branch_losses(line: TreeLine, path: PathTokens) -> list[tuple[int, int]]:
    """For each trained token of `path`: (the line's index of that token, its parent's index), walking the line."""
    out, at = [], -1
    for depth, tok in enumerate(path.ids):
        at = next(
            i
            for i, (p, t) in enumerate(zip(line.parent, line.input_ids, strict=True))
            if p == at and t == tok
        )
        assert line.position_ids[at] == depth
        if path.trained[depth]:
            out.append(at)
    return out


def test_a_path_that_is_a_prefix_of_another_counts_twice():
    # path a = 1 2 3 (3 trained), path b = 1 2 3 4 5 (3 and 5 trained): one branch of 5 tokens
    a, b = P("123", "001", "a"), P("12345", "00101", "b")
    tree = PackedTree.of([b, a])
    assert tree.input_ids == [1, 2, 3, 4, 5]
    assert tree.parent == [-1, 0, 1, 2, 3]
    assert tree.position_ids == [0, 1, 2, 3, 4]
    # token 3 is in both paths' loss, token 5 in b's: the path objective is l3 + (l3 + l5) = 2 l3 + l5
    assert tree.loss_weight == [0, 0, 2, 0, 1]


def test_two_paths_sharing_edges_branch_once():
    # a = 1 2 3 4 6 7, b = 1 2 3 4 8 9 share the prefix 1 2 3 4 (4 trained in both); then they branch
    a, b = P("123467", "000101", "a"), P("123489", "000111", "b")
    tree = PackedTree.of([a, b])
    assert tree.input_ids == [1, 2, 3, 4, 6, 7, 8, 9]
    assert tree.parent == [-1, 0, 1, 2, 3, 4, 3, 6]  # 8 is a second child of 4: predicted from 4's logits too
    assert tree.position_ids == [0, 1, 2, 3, 4, 5, 4, 5]
    assert tree.loss_weight == [0, 0, 0, 2, 0, 1, 1, 1]
    line = pack_paths([a, b], 100, "t")[0][0]
    assert line_problem(line.to_dict()) is None
    assert branch_losses(line, a) == [3, 5] and branch_losses(line, b) == [3, 6, 7]


def test_a_token_trained_on_one_path_only_is_shared_with_its_weight():
    # the same ids, trained on a (a completion) and context on b: one node, weight 1 (its loss is the same in both)
    a, b = P("1234", "0011", "a"), P("1235", "0000", "b")
    tree = PackedTree.of([a, b])
    assert tree.input_ids == [1, 2, 3, 4, 5] and tree.loss_weight == [0, 0, 1, 1, 0]
    # the first token of a branch has no context: never weighted (the path form never predicts it either)
    assert PackedTree.of([P("12", "11")]).loss_weight == [0, 1]


def test_no_two_tokens_share_a_parent_and_an_id():
    paths = [P("1213", "0101"), P("1214", "0011"), P("12", "01"), P("3", "0"), P("1213", "0101")]
    line = pack_paths(paths, 100, "t")[0][0]
    assert line_problem(line.to_dict()) is None
    assert Counter(zip(line.parent, line.input_ids, strict=True)).most_common(1)[0][1] == 1
    # the duplicate path is trained twice, as the path form trains its two records
    assert line.objective == sum(p.n_trained for p in paths)
    bad = line.to_dict() | {"parent": [-1, 0, 1, 2, 1, 0, -1][: len(line)]}
    assert line_problem(bad) is not None


def test_parts_under_a_cap_carry_their_ancestors():
    # sorted: 1111 1122 1123 2222; cap 6: 1111 + 1122 costs 4 + 2 = 6, 1123 would add 1: a new part, which
    # repeats its ancestors 1 1 2; 2222 shares nothing with 1123 and 4 + 4 > 6: a third part
    paths = [P("2222", "0011"), P("1123", "0001"), P("1111", "0001"), P("1122", "0011"), P("9" * 7, "0" * 7)]
    parts, too_long = split_parts(paths, 6)
    assert [[p.ids for p in part] for part in parts] == [
        [(1, 1, 1, 1), (1, 1, 2, 2)],
        [(1, 1, 2, 3)],
        [(2, 2, 2, 2)],
    ]
    assert [p.ids for p in too_long] == [(9,) * 7]
    lines, stats = pack_paths(paths, 6, "t")
    assert [len(x) for x in lines] == [6, 4, 4]
    assert [(x.metadata["part"], x.metadata["parts"]) for x in lines] == [(1, 3), (2, 3), (3, 3)]
    assert lines[1].input_ids == (1, 1, 2, 3) and lines[1].loss_weight == (0, 0, 0, 1)
    assert all(line_problem(x.to_dict()) is None for x in lines)
    assert stats.objective == sum(p.n_trained for p in paths[:4]) == 6 and stats.dropped == {"too_long": 1}
    # the whole trie would be 4 + 2 + 1 + 4 = 11 tokens; the parts process 14 (1 1 2 again)
    assert (stats.unsplit, stats.processed, stats.longest, stats.parts) == (11, 14, 6, 3)


@pytest.fixture
def fixture_paths(tmp_path):
    return paths_of(make_results(tmp_path / "results", reasoning=False))


def test_the_fixture_tree_packs_its_paths_under_the_student(fixture_paths):
    st = student(QWEN)
    records, _ = export_task([fixture_paths], "path", student=st)
    assert len(records) >= 2
    lines, stats = pack_records(records, st, 100_000)
    assert len(lines) == 1 and line_problem(lines[0].to_dict()) is None
    line = lines[0]
    # every path is a branch of the line whose trained tokens are the path form's, weighted by the paths
    weight = Counter()
    for rec in records:
        p = path_tokens(st, rec)
        assert p.n_trained == rec["metadata"]["student_tokens"]["completion_tokens"]
        for i in branch_losses(line, p):
            weight[i] += 1
    assert {i: w for i, w in enumerate(line.loss_weight) if w} == dict(weight)
    assert stats.path_processed == sum(r["metadata"]["student_tokens"]["total_tokens"] for r in records)
    assert stats.processed < stats.path_processed  # the paths share the session's start
    meta = line.metadata
    assert (
        meta["task"] == records[0]["metadata"]["task"]
        and meta["part"] == 1
        and len(meta["paths"]) == len(records)
    )
    assert TreeLine.from_dict(json.loads(json.dumps(line.to_dict()))) == line


def test_export_and_merge_write_the_tree_form_and_the_card_gives_every_form(fixture_paths, tmp_path):
    import argparse

    from sftree.dataset import export
    from sftree.dataset.merge import merge
    from sftree.errors import InputError
    from sftree.records.sft import stats_path

    qwen = str(student(QWEN).source)
    parser = argparse.ArgumentParser()
    export.add_arguments(parser)
    out, tree = tmp_path / "t" / "sft.jsonl", tmp_path / "t" / "sft.tree.jsonl"
    argv = ["--paths", str(fixture_paths), "--out", str(out), "--granularity", "merged", "--student", qwen]
    argv += [
        "--student-max-length",
        "100000",
        "--tree-packed",
    ]  # the tree form beside --out; the cap: the schema's
    assert export.run(parser.parse_args(argv)) == 0
    lines = list(iter_tree_lines(tree))  # each line checked (`line_problem`)
    assert len(lines) == 1  # the fixture's two paths, sharing edge e1
    one = read_tree_stats(tree)
    assert one["parts"] == len(lines) and one["tokens_processed"] == sum(len(x) for x in lines)
    assert one["tokens_unsplit"] == one["tokens_processed"] < one["path_tokens_processed"]
    assert one["tokens_objective"] > one["tokens_trained"]  # e1's trained tokens weigh 2
    card = tmp_path / "card.md"
    stats = merge(
        [str(out)],
        str(tmp_path / "sft.jsonl"),
        None,
        str(card),
        tree=([str(tree)], str(tmp_path / "sft.tree.jsonl")),
    )
    assert (tmp_path / "sft.tree.jsonl").read_text() == tree.read_text()
    assert stats.tree.to_dict() == one
    text = card.read_text()
    assert "## Forms under the Student" in text
    merged_student = json.loads(stats_path(out).read_text())["student"]
    for form, processed, trained in (
        ("step", merged_student["tokens_processed_as_steps"], merged_student["tokens_trained"]),
        ("merged", merged_student["tokens_processed"], merged_student["tokens_trained"]),
        ("path", one["path_tokens_processed"], one["tokens_trained"]),
        ("tree", one["tokens_processed"], one["tokens_trained"]),
    ):
        assert f"| {form} | {processed} | {trained} | {processed / trained:.2f} |" in text
    # the tree form processes fewer tokens per trained token than the merged form
    assert (
        one["tokens_processed"] / one["tokens_trained"]
        < merged_student["tokens_processed"] / merged_student["tokens_trained"]
    )
    argv[argv.index("--student") : argv.index("--student") + 4] = []
    with pytest.raises(InputError, match="tree_packed needs export.student"):
        export.run(parser.parse_args(argv))


def test_a_path_holding_control_token_text_is_left_out_of_the_tree_form_as_of_the_path_form(
    fixture_paths, tmp_path
):
    """The tree form checks its path records' data text as the path form does (its own special-text figures):
    a tool output forging a turn drops that path from the tree form, counted, and the export goes on."""
    import argparse

    from test_export_special_text import forged, plant

    from sftree.dataset import export

    plant(fixture_paths.parent, "e2", forged("chatml/qwen"))
    parser = argparse.ArgumentParser()
    export.add_arguments(parser)
    out, tree = tmp_path / "t" / "sft.jsonl", tmp_path / "t" / "sft.tree.jsonl"
    argv = ["--paths", str(fixture_paths), "--out", str(out), "--granularity", "merged"]
    argv += ["--student", str(student(QWEN).source), "--student-max-length", "100000", "--tree-packed"]
    assert export.run(parser.parse_args(argv)) == 0
    records, _ = export_task([fixture_paths], "path", student=student(QWEN))
    assert len(records) == 1  # of the fixture's two paths, the one through e2 is dropped
    assert read_tree_stats(tree)["paths"] == 1
    assert [p["id"] for p in next(iter_tree_lines(tree)).metadata["paths"]] == [records[0]["metadata"]["id"]]
