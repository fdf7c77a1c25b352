"""Each record that crosses a stage (sftree.records): what its one writer writes, its one reader reads back equal;
a bad file is an InputError naming the file and the field (or line) that is wrong."""

import json

import pytest
from helpers.export import RECORD_META
from helpers.mcts import search_params

from sftree.errors import InputError
from sftree.records import root as root_rec
from sftree.records import sft as sft_rec
from sftree.records import steplog
from sftree.records import tree as tree_rec
from sftree.records import tree_packed as tree_form
from sftree.search import tree as treemod

ROOT_FIELDS = {
    "eval_count": 41, "agent_id": "agent-2", "commit_hash": "ab12cd34", "eval_ok": True, "note": "ünïcode",
    "score": 2.31, "stage": "middle", "selection_reason": "quota", "task": "circle_packing",
    "direction": "maximize", "snapshots_pending": 3,
}  # fmt: skip


def test_root_metadata_round_trip_and_bytes(tmp_path):
    path = root_rec.write_root_meta(tmp_path, ROOT_FIELDS)
    assert path == tmp_path / "metadata.json"
    # 2-space JSON, non-ASCII kept, one newline: the bytes select-roots has always written
    assert path.read_text(encoding="utf-8") == json.dumps(ROOT_FIELDS, indent=2, ensure_ascii=False) + "\n"
    meta = root_rec.read_root_meta(tmp_path)
    assert meta.to_dict() == ROOT_FIELDS and list(meta.to_dict()) == list(ROOT_FIELDS)
    assert (meta.task, meta.direction, meta.score, meta.eval_count, meta.stage, meta.snapshots_pending) == (
        "circle_packing", "maximize", 2.31, 41, "middle", 3)  # fmt: skip
    with pytest.raises(TypeError):
        meta.fields["score"] = 0.0  # the record read is read-only


def test_root_metadata_is_a_new_file_not_the_snapshots(tmp_path):
    snap, root = tmp_path / "snap", tmp_path / "root"
    snap.mkdir()
    root.mkdir()
    root_rec.write_root_meta(snap, {"eval_count": 1})
    (root / "metadata.json").hardlink_to(snap / "metadata.json")
    root_rec.write_root_meta(root, {"eval_count": 1, "stage": "late"})
    assert root_rec.read_root_meta(snap).to_dict() == {"eval_count": 1}


@pytest.mark.parametrize(
    ("text", "needle"),
    [("{not json", "is not valid JSON"), ("[1, 2]", "must hold a JSON object, not list")],
)
def test_bad_root_metadata_names_the_file(tmp_path, text, needle):
    (tmp_path / "metadata.json").write_text(text)
    with pytest.raises(InputError, match=needle) as err:
        root_rec.read_root_meta(tmp_path)
    assert str(tmp_path / "metadata.json") in str(err.value)
    with pytest.raises(InputError, match="root metadata not found"):
        root_rec.read_root_meta(tmp_path / "missing")


@pytest.mark.parametrize(
    ("links", "field"),
    [
        ([], "`root_links` must be an object"),
        ({"source": "relative/snap", "entries": {}}, "`root_links.source` must be an absolute path"),
        ({"source": "/abs/snap", "entries": {"code": 1}}, "`root_links.entries` must map paths"),
    ],
)
def test_bad_root_links_name_the_file_and_field(tmp_path, links, field):
    root_rec.write_root_meta(tmp_path, {"root_links": links})
    with pytest.raises(InputError, match=field) as err:
        root_rec.read_root_meta(tmp_path).links()
    assert str(tmp_path / "metadata.json") in str(err.value)
    with pytest.raises(InputError, match=field):
        root_rec.verify_root(tmp_path)  # what explore's preflight runs
    root_rec.write_root_meta(
        tmp_path, {"root_links": {"source": "/abs/snap", "entries": {"code": "1:2:3:4"}}}
    )
    assert root_rec.read_root_meta(tmp_path).links() == ("/abs/snap", {"code": "1:2:3:4"})


def _tree_doc() -> dict:
    t = treemod.Tree.new("t", "eval-000001-agent-1-abc", "minimize", search_params(), 1.5,
                         {"code_commit": "c0", "knowledge_commit": "k0", "session": None}, 10)  # fmt: skip
    return t.to_dict()


def test_tree_round_trip_and_schema_check(tmp_path):
    doc = _tree_doc()
    path = tree_rec.final_path(tmp_path)
    tree_rec.write_tree(path, doc)
    assert tree_rec.read_tree_doc(path) == doc
    assert tree_rec.read_tree(path) == tree_rec.Tree.from_doc(doc)  # the typed form readers get
    assert treemod.load(path).to_dict() == doc
    bad = json.loads(json.dumps(doc))
    bad["nodes"][0]["depth"] = "zero"
    tree_rec.write_tree(path, bad)
    with pytest.raises(InputError) as err:
        tree_rec.read_tree(path)
    assert str(path) in str(err.value) and "nodes.0.depth" in str(err.value)
    assert tree_rec.read_tree_doc(path, check=False) == bad  # a reader that takes whatever is there
    assert tree_rec.read_tree(path, check=False).root_node.depth == "zero"


def test_live_files_round_trip_and_a_bad_line_names_file_and_line(tmp_path):
    live = tree_rec.LiveFiles(tmp_path)
    live.write_snapshot({**_tree_doc(), "log_gen": "g1"})
    entries = [{"gen": "g1", "n": i} for i in range(3)]
    for e in entries:
        live.append(e)
    live.close()
    assert live.read_snapshot()["log_gen"] == "g1"
    assert [e for _n, e in live.log_entries()] == entries
    with open(live.log_path, "a", encoding="utf-8") as fh:
        fh.write("[1]\n")
    with pytest.raises(InputError, match=r"tree\.log\.jsonl line 4: not a JSON object"):
        list(live.log_entries())
    live.remove()
    assert not live.exists() and not live.log_path.exists()


def test_steps_round_trip(tmp_path):
    path = tmp_path / steplog.edge_steps("e1")
    rec = steplog.StepRecorder(path, "e1")
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    records = [
        {"turn": 1, "step": 1, "kind": "agent", "request": {"model": "m", "messages": msgs},
         "response": {"role": "assistant", "content": "a"}, "latency_s": 0.5},
        {"turn": 1, "step": 2, "kind": "agent",
         "request": {"model": "m", "messages": [*msgs, {"role": "assistant", "content": "a"}]},
         "response": None, "error": "boom", "latency_s": 0.25},
    ]  # fmt: skip
    for r in records:
        rec.write(r)
    rec.close()
    assert steplog.read_steps(path) == [{"edge": "e1", **r} for r in records]
    assert rec.latency_s == 0.75 and rec.records == 2


META = RECORD_META
STEP_RECORD = {
    "prompt": [{"role": "user", "content": "Improve the packing: ünïcode"}],
    "completion": [{"role": "assistant", "content": "Done."}],
    "tools": [],
    "metadata": META,
}
MERGED_RECORD = {
    "messages": [*STEP_RECORD["prompt"], *STEP_RECORD["completion"]],
    "tools": [],
    "metadata": META | {"granularity": "merged", "trained": [1], "steps": [META["id"]]},
    "input_ids": [1, 2, 3],
    "completion_mask": [0, 1, 1],
}
PATH_RECORD = {
    "messages": MERGED_RECORD["messages"],
    "tools": [],
    "metadata": {k: v for k, v in META.items() if k not in ("edge",)}
    | {
        "granularity": "path",
        "cut": None,
        "edge": "e1",
        "student_tokens": MERGED_RECORD["metadata"]["usage"],
    },
}


@pytest.mark.parametrize("doc", [STEP_RECORD, MERGED_RECORD], ids=["step", "merged"])
def test_sft_records_are_typed_and_written_byte_for_byte(tmp_path, doc):
    out = tmp_path / "sft.jsonl"
    rec = sft_rec.record_from_doc(doc, "a record")
    with sft_rec.record_writer(out) as w:
        w.write(rec)
        w.write(rec)
    line = json.dumps(doc, ensure_ascii=False) + "\n"
    assert out.read_text(encoding="utf-8") == 2 * line  # the keys in the export's order, nothing added
    assert list(sft_rec.iter_records(out)) == [rec, rec] and sft_rec.merged_path(tmp_path) == out
    assert rec.messages[rec.trained[0]]["content"] == "Done." and rec.metadata.usage.total_tokens == 12


def test_each_form_has_its_record_and_a_path_record_keeps_its_cut():
    forms = [sft_rec.record_from_doc(d, "r") for d in (STEP_RECORD, PATH_RECORD, MERGED_RECORD)]
    assert [type(r).__name__ for r in forms] == ["StepRecord", "PathRecord", "MergedRecord"]
    path = forms[1]
    assert path.to_doc()["metadata"]["cut"] is None and path.metadata.student_tokens is not None
    assert (
        list(path.to_doc()["metadata"]).index("cut")
        == list(path.to_doc()["metadata"]).index("path_ranks") + 1
    )


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({**STEP_RECORD, "completion": []}, "completion: expected one message"),
        (
            {**STEP_RECORD, "metadata": {**META, "usage": {"prompt_tokens": -1}}},
            "metadata.usage.prompt_tokens",
        ),
        (
            {**STEP_RECORD, "metadata": {**META, "granularity": "steps"}},
            "metadata.granularity: expected one of",
        ),
        (
            {**MERGED_RECORD, "metadata": {**MERGED_RECORD["metadata"], "trained": [7]}},
            "trained: an index outside",
        ),
        ({**MERGED_RECORD, "completion_mask": [1]}, "input_ids and completion_mask go together"),
        ({k: v for k, v in STEP_RECORD.items() if k != "tools"}, "tools: missing"),
        ([], "the SFT record is not a JSON object"),
    ],
)
def test_a_wrong_record_names_file_line_and_field(tmp_path, doc, field):
    out = tmp_path / "sft.jsonl"
    out.write_text(json.dumps(STEP_RECORD) + "\n" + json.dumps(doc) + "\n")
    with pytest.raises(InputError, match=f"SFT file {out} line 2") as err:
        list(sft_rec.iter_records(out))
    assert field in str(err.value)


def test_sft_stats_and_figures_round_trip(tmp_path):
    out = tmp_path / "sft.jsonl"
    stats = {"version": sft_rec.STATS_VERSION, "records": 2, "excluded": {"truncated": 1}}
    sft_rec.write_stats(out, stats)
    assert (
        sft_rec.stats_path(out) == tmp_path / "sft.stats.json"
        and sft_rec.read_stats(sft_rec.stats_path(out)) == stats
    )
    assert sft_rec.read_figures(out) is None  # before the merge wrote any
    figures = {
        "version": sft_rec.FIGURES_VERSION,
        "records": 2,
        "by_task_stage": [["circle_packing", "middle", 2]],
    }
    sft_rec.write_figures(out, figures)
    assert sft_rec.read_figures(out) == figures and sft_rec.figures_path(out) == tmp_path / "sft.figures.json"
    # the same trained message (tool-call ids aside) is the same target
    rec = sft_rec.record_from_doc(STEP_RECORD, "r")
    assert sft_rec.target_key(rec) == sft_rec.target_key(
        sft_rec.record_from_doc(json.loads(json.dumps(STEP_RECORD)), "r")
    )


def test_bad_sft_files_name_the_file(tmp_path):
    out = tmp_path / "sft.jsonl"
    out.write_text(json.dumps(STEP_RECORD) + "\n{not json\n")
    with pytest.raises(InputError, match="line 2") as err:
        list(sft_rec.iter_records(out))
    assert str(out) in str(err.value)
    sft_rec.stats_path(out).write_text(json.dumps({"version": 99}))
    with pytest.raises(InputError, match="not an export stats file of version 1"):
        sft_rec.read_stats(sft_rec.stats_path(out))
    sft_rec.figures_path(out).write_text("[]")
    with pytest.raises(InputError, match="not a dataset figures file"):
        sft_rec.read_figures(out)
    assert sft_rec.schema_problem({"metadata": {}}) is not None  # neither form: the schema says so


# two paths 5 7 9 (9 trained) and 5 7 8 8 (both 8s trained) packed: 7 is a branch point, 9 and 8 its children
TREE_LINE = tree_form.TreeLine(
    (5, 7, 9, 8, 8), (0, 1, 2, 2, 3), (-1, 0, 1, 1, 3), (0, 0, 1, 1, 1), {"task": "t", "part": 1, "parts": 1}
)


def test_tree_form_lines_and_stats_round_trip(tmp_path):
    out = tree_form.merged_tree_path(tmp_path)
    assert out == tmp_path / "sft.tree.jsonl"
    assert tree_form.write_tree_lines(out, [TREE_LINE, TREE_LINE]) == 2
    assert list(tree_form.iter_tree_lines(out)) == [TREE_LINE, TREE_LINE]
    # the fields in the documented order, one JSON object a line
    first = out.read_text().splitlines()[0]
    assert list(json.loads(first)) == ["input_ids", "position_ids", "parent", "loss_weight", "metadata"]
    assert next(tree_form.iter_tree_lines(out)).metadata == TREE_LINE.metadata
    assert (TREE_LINE.trained, TREE_LINE.objective, len(TREE_LINE)) == (3, 3, 5)
    figures = {"paths": 2, "parts": 1, "tokens_processed": 5}
    tree_form.write_tree_stats(out, figures)
    assert tree_form.tree_stats_path(out) == tmp_path / "sft.tree.stats.json"
    assert tree_form.read_tree_stats(out) == figures


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"parent": [-1, 0, 1, 1, 5]}, "token 4: parent 5 is not an earlier token"),
        ({"position_ids": [0, 1, 2, 3, 3]}, "token 3: position 3 is not its parent's"),
        ({"input_ids": [5, 7, 9, 9, 8]}, "token 3: a second child of 1 with id 9"),
        ({"loss_weight": [1, 0, 1, 1, 1]}, "token 0: loss weight 1"),
        ({"loss_weight": [0, 0, 1, 1]}, "lists of different lengths"),
        ({"input_ids": [5, 7, 9, "8", 8]}, "token 3: id '8' is not a non-negative integer"),
        ({"metadata": []}, "metadata is not an object"),
        ({"parent": None}, "not an object with the lists"),
    ],
)
def test_a_bad_tree_form_line_names_file_line_and_token(tmp_path, change, needle):
    out = tmp_path / "sft.tree.jsonl"
    good = json.dumps(TREE_LINE.to_dict())
    out.write_text(good + "\n" + json.dumps(TREE_LINE.to_dict() | change) + "\n")
    with pytest.raises(InputError, match=needle) as err:
        list(tree_form.iter_tree_lines(out))
    assert f"tree-form file {out} line 2" in str(err.value)


def test_a_bad_tree_form_stats_file_is_named(tmp_path):
    out = tmp_path / "sft.tree.jsonl"
    tree_form.tree_stats_path(out).write_text(json.dumps({"version": 1, "records": 2}))
    with pytest.raises(InputError, match="not a tree-form stats file of version 1") as err:
        tree_form.read_tree_stats(out)
    assert str(tmp_path / "sft.tree.stats.json") in str(err.value)
