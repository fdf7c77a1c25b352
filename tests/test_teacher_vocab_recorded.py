"""Explore records the Teacher's vocabulary in tree.json `teacher_vocab` (the export's same-tokenizer check reads it):
from `teacher.tokenizer`, else the GGUF `teacher.launch` serves (teacher/vocabulary.py `teacher_tokenizer`). The
digest is the export's own (`vocabulary_sha256` of the Student's tokenizer); a resumed tree of another vocabulary and a bad path are clear
errors."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers.explore import explore, make_root, write_config
from helpers.mcts import search_params

from sftree.config import REPO_ROOT
from sftree.dataset.student import gguf_tokenizer
from sftree.errors import InputError
from sftree.records.tree import read_tree, validate_tree
from sftree.search import tree as treemod
from sftree.search.explore import record_teacher_vocab
from sftree.settings import TeacherSettings, section_settings
from sftree.teacher.llm_server import DEFAULT_MODEL
from sftree.teacher.vocabulary import (
    TokenizerRef,
    Vocabulary,
    read_vocabulary_at,
    teacher_tokenizer,
    vocabulary_sha256,
)


def make_tokenizer(folder, words=("a", "b", "c")):
    """A tiny HF model folder: a WordLevel tokenizer saved as tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(
        models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}, unk_token="[UNK]")
    )
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return tok


def with_teacher(config, **teacher):
    """The config file with these `teacher:` keys added."""
    cfg = yaml.safe_load(config.read_text())
    cfg["teacher"].update(teacher)
    config.write_text(yaml.safe_dump(cfg))
    return config


GGUF_TOKENS = ["a", "b", "ab", "Ġ", "Ġa", "<|im_end|>", "<tool_call>"]


def make_gguf(path, pad=0):
    """A tiny byte-level BPE GGUF holding only its tokenizer (as llama.cpp's ggml-vocab-*.gguf files do); `pad`
    entries `[PAD<id>]` after it, as llama.cpp's converter fills a vocabulary up to the embedding size."""
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    n = len(GGUF_TOKENS)
    w.add_token_list(GGUF_TOKENS + [f"[PAD{n + i}]" for i in range(pad)])
    w.add_token_types([1, 1, 1, 1, 1, 3, 4] + [5] * pad)  # normal, control, user-defined (added), unused
    w.add_token_merges(["a b", "Ġ a"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def teacher(**values) -> TeacherSettings:
    return section_settings(TeacherSettings, values)


# --- which tokenizer is the Teacher's ---------------------------------------------------------------------------


def test_the_teacher_tokenizer_is_the_configured_one_else_the_launched_gguf_else_none(tmp_path):
    assert teacher_tokenizer(teacher(tokenizer="models/t")) == TokenizerRef(
        "teacher.tokenizer", REPO_ROOT / "models/t"
    )
    assert teacher_tokenizer(teacher(tokenizer=str(tmp_path))).path == tmp_path  # absolute: as given
    # teacher.tokenizer wins over the launched model
    both = teacher(tokenizer=str(tmp_path), launch={"model": "m.gguf"})
    assert teacher_tokenizer(both) == TokenizerRef("teacher.tokenizer", tmp_path)
    # only teacher.launch: its GGUF, resolved as LaunchSpec resolves it (no server is started)
    launched = teacher_tokenizer(teacher(launch={"model": "models/m.gguf"}))
    assert launched == TokenizerRef("teacher.launch.model", REPO_ROOT / "models/m.gguf")
    assert teacher_tokenizer(teacher(launch={})) == TokenizerRef("teacher.launch.model", DEFAULT_MODEL)
    # teacher-sim stands in for the launched server (edge.start_teacher starts it first); a bare base_url: unknown
    assert teacher_tokenizer(teacher(launch={"model": "m.gguf"}, sim={"seed": 0})) is None
    assert teacher_tokenizer(teacher()) is None


def test_the_digest_is_the_exports_for_an_hf_folder_and_a_gguf(tmp_path):
    """teacher/vocabulary.py reads the files itself (explore may not import the export's modules): the digest and
    size it gives are those of the tokenizer the export loads as the Student (a GGUF rebuilt by
    dataset/student.py, an HF folder's tokenizer.json)."""
    from tokenizers import Tokenizer

    make_tokenizer(tmp_path / "hf")
    gguf = make_gguf(tmp_path / "v.gguf")
    students = {
        tmp_path / "hf": Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json")),
        gguf: gguf_tokenizer(gguf),
    }
    for path, tok in students.items():
        ours = read_vocabulary_at(TokenizerRef("teacher.tokenizer", path))
        assert ours.sha256 == vocabulary_sha256(tok), path
        assert ours.size == tok.get_vocab_size(with_added_tokens=True), path


def test_llama_cpps_padding_entries_are_not_part_of_the_vocabulary(tmp_path):
    """A GGUF filled up to its embedding size with `[PAD<id>]` tokens has the vocabulary of the same GGUF without
    them, as the Student reads either (an HF folder has none: Qwen2.5-7B's GGUF holds 152,064 entries, its
    tokenizer.json 151,665)."""
    plain, padded = make_gguf(tmp_path / "a.gguf"), make_gguf(tmp_path / "b.gguf", pad=3)
    ours = [read_vocabulary_at(TokenizerRef("teacher.tokenizer", p)) for p in (plain, padded)]
    assert ours[0].sha256 == ours[1].sha256 and (ours[0].size, ours[1].size) == (7, 10)
    assert (
        vocabulary_sha256(gguf_tokenizer(padded))
        == vocabulary_sha256(gguf_tokenizer(plain))
        == ours[0].sha256
    )
    other = tmp_path / "c.gguf"
    make_gguf(other, pad=1)
    text = other.read_bytes().replace(b"[PAD7]", b"[PAD8]")  # a token that only looks like padding counts
    other.write_bytes(text)
    assert read_vocabulary_at(TokenizerRef("teacher.tokenizer", other)).sha256 != ours[0].sha256


@pytest.mark.parametrize("case", ["missing", "no tokenizer.json", "not a gguf"])
def test_an_unreadable_tokenizer_names_the_key_and_the_path(tmp_path, case):
    path = {"missing": tmp_path / "nope", "no tokenizer.json": tmp_path, "not a gguf": tmp_path / "x.gguf"}[
        case
    ]
    if case == "not a gguf":
        path.write_bytes(b"not a gguf")
    why = {
        "missing": "not found",
        "no tokenizer.json": "neither an HF model folder",
        "not a gguf": "not a readable GGUF",
    }
    with pytest.raises(InputError, match=rf"teacher\.tokenizer {path}: {why[case]}"):
        read_vocabulary_at(TokenizerRef("teacher.tokenizer", path))


# --- what a run records -----------------------------------------------------------------------------------------

A = Vocabulary("a" * 64, 4, "/m/a")
B = Vocabulary("b" * 64, 4, "/m/b")


def test_a_run_records_its_vocabulary_keeps_the_trees_and_refuses_another(tmp_path):
    f = tmp_path / "tree.live.json"
    assert record_teacher_vocab(None, A, f) == A.to_doc()  # a new tree
    assert record_teacher_vocab(A.to_doc(), None, f) == A.to_doc()  # none known now: the tree's stays
    assert record_teacher_vocab(None, None, f) is None
    moved = Vocabulary(A.sha256, A.size, "/elsewhere/a")  # the same vocabulary read from another place
    assert record_teacher_vocab(A.to_doc(), moved, f) == A.to_doc()
    with pytest.raises(InputError, match=rf"{f}: .*/m/a .*/m/b .*two vocabularies"):
        record_teacher_vocab(A.to_doc(), B, f)


def test_the_live_tree_keeps_teacher_vocab_across_snapshot_and_log_lines(tmp_path):
    tree = treemod.Tree.new(
        "t", "r", "maximize", search_params(), 1.0, {"code_commit": "c", "knowledge_commit": "k"}
    )
    tree.teacher_vocab = A.to_doc()
    live = treemod.LiveTree(tmp_path)
    live.save(tree)  # the snapshot
    tree.next_edge = 2
    live.save(tree)  # a log line
    live.close()
    assert treemod.LiveTree(tmp_path).load().teacher_vocab == A.to_doc()
    assert treemod.Tree.from_dict(tree.to_dict()).teacher_vocab == A.to_doc()


def test_the_schema_takes_a_vocabulary_or_null_and_refuses_a_malformed_one():
    tree = treemod.Tree.new(
        "t", "r", "maximize", search_params(), 1.0, {"code_commit": "c", "knowledge_commit": "k"}
    )
    doc = tree.to_dict()
    assert doc["teacher_vocab"] is None
    validate_tree(doc)
    validate_tree({**doc, "teacher_vocab": A.to_doc()})
    for bad in ({**A.to_doc(), "sha256": "xyz"}, {"sha256": A.sha256, "size": 4}, {**A.to_doc(), "size": 0}):
        with pytest.raises(InputError, match="teacher_vocab"):
            validate_tree({**doc, "teacher_vocab": bad})


# --- explore ----------------------------------------------------------------------------------------------------


def test_explore_records_the_teacher_tokenizers_vocabulary_in_tree_json(tmp_path):
    tok = make_tokenizer(tmp_path / "teacher_tok")
    root = make_root(tmp_path)
    cfg = with_teacher(
        write_config(tmp_path, {"root_children": 1, "max_depth": 1}), tokenizer=str(tmp_path / "teacher_tok")
    )
    out = tmp_path / "trees" / root.name
    assert explore(root, out, cfg) == 0
    doc = json.loads((out / "tree.json").read_text())
    validate_tree(doc, "tree.json")
    assert doc["teacher_vocab"] == {
        "sha256": vocabulary_sha256(tok),
        "size": 4,
        "source": str(tmp_path / "teacher_tok"),
    }
    assert read_tree(out / "tree.json").teacher_vocab == doc["teacher_vocab"]  # the export's reader sees it


def test_a_resumed_tree_of_another_vocabulary_is_refused_naming_the_tree_and_both(tmp_path, capsys):
    """Checked before the Teacher is contacted (nothing listens at base_url): the live tree stays to resume."""
    first, other = (
        make_tokenizer(tmp_path / "first"),
        make_tokenizer(tmp_path / "other", words=("x", "y", "z")),
    )
    root = make_root(tmp_path)
    out = tmp_path / "trees" / root.name
    state = {"code_commit": "c0", "knowledge_commit": "k0", "session": None}
    tree = treemod.Tree.new(
        "circle_packing", root.name, "maximize", search_params(max_depth=1), 1.2, state, 7
    )
    tree.teacher_vocab = read_vocabulary_at(TokenizerRef("teacher.tokenizer", tmp_path / "first")).to_doc()
    treemod.save(tree, out / "tree.live.json")  # a running tree, as a killed run leaves it
    cfg = with_teacher(write_config(tmp_path, {"max_depth": 1}, base_url="http://127.0.0.1:9/v1"),
                       tokenizer=str(tmp_path / "other"))  # fmt: skip
    assert explore(root, out, cfg) == 2
    err = capsys.readouterr().err
    for part in (
        str(out / "tree.live.json"),
        str(tmp_path / "first"),
        str(tmp_path / "other"),
        "two vocabularies",
    ):
        assert part in err, (part, err)
    assert vocabulary_sha256(first) in err and vocabulary_sha256(other) in err
    assert (
        treemod.load(out / "tree.live.json").teacher_vocab == tree.teacher_vocab
        and not (out / "tree.json").exists()
    )


def test_explore_with_a_bad_teacher_tokenizer_fails_naming_it_and_writes_nothing(tmp_path, capsys):
    root = make_root(tmp_path)
    cfg = with_teacher(write_config(tmp_path, {}), tokenizer="no/such/tokenizer")
    out = tmp_path / "trees" / root.name
    assert explore(root, out, cfg) == 2
    assert f"teacher.tokenizer {REPO_ROOT / 'no/such/tokenizer'}: not found" in capsys.readouterr().err
    assert not out.exists()  # preflight: before the first write
