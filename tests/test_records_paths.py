"""paths.json (sftree.records.paths): what select-paths writes reads back as the same typed `Paths`, in the
documented key order; a bad file is an InputError naming the file and the field that is wrong."""

from __future__ import annotations

import copy
import json

import pytest

from sftree.errors import InputError
from sftree.records.paths import (
    PATH_SCORES,
    PATHS_VERSION,
    Excluded,
    PathCounts,
    Paths,
    RankedPath,
    paths_path,
    read_paths,
    write_paths,
)


def scores(*values: float) -> dict[str, float]:
    """The seven section-3.4 figures in their order (`PathScores`: keywords)."""
    return dict(zip(PATH_SCORES, values, strict=True))


PATHS = Paths(
    version=PATHS_VERSION,
    task="circle_packing",
    root="eval-000047-agent-4",
    direction="maximize",
    root_score=2.31,
    top_k=1,
    counts=PathCounts(candidates=2, selected=1, excluded=1),
    paths=(
        RankedPath(1, True, "n7", "depth_limit", ("n1", "n4", "n7"), ("e1", "e5", "e9"),
                   **scores(0.9, 0.8, 2.4, 0.75, 2.5, 0.75, 0.8225)),
        RankedPath(2, False, "n3", "no_room", ("n3",), ("e3",), **scores(1, 0.5, 2.0, 0.25, 2, 0.25, 0.45)),
    ),
    excluded=(Excluded("n9", "missing score on n6: ünïcode"),),
)  # fmt: skip

DOC_KEYS = ["version", "task", "root", "direction", "root_score", "top_k", "counts", "paths", "excluded"]
PATH_KEYS = [
    "rank", "selected", "leaf", "leaf_reason", "nodes", "edges", "avg_cleanliness", "avg_knowledge", "avg_score",
    "avg_score_rank", "max_score", "max_score_rank", "path_score",
]  # fmt: skip


def test_written_paths_read_back_equal_in_the_documented_order(tmp_path):
    path = paths_path(tmp_path)
    write_paths(path, PATHS)
    assert read_paths(path) == PATHS
    text = path.read_text(encoding="utf-8")
    # 2-space JSON, non-ASCII as is, an int stays an int (the bytes select-paths has always written)
    assert text == json.dumps(PATHS.to_doc(), indent=2, ensure_ascii=False) + "\n"
    doc = json.loads(text)
    assert list(doc) == DOC_KEYS and all(list(p) == PATH_KEYS for p in doc["paths"])
    assert list(doc["counts"]) == ["candidates", "selected", "excluded"]
    assert doc["paths"][1]["avg_cleanliness"] == 1 and '"avg_cleanliness": 1,' in text


def test_selected_is_best_rank_first():
    shuffled = Paths.from_doc(
        PATHS.to_doc() | {"paths": [p.to_doc() | {"selected": True} for p in PATHS.paths[::-1]]}
    )
    assert [p.rank for p in shuffled.selected] == [1, 2]
    assert [p.leaf for p in PATHS.selected] == ["n7"]


def _set(doc, where, value):
    """doc with the field at `where` (keys and list indexes) set to `value`, or removed when value is ...."""
    doc = copy.deepcopy(doc)
    *parents, last = where
    target = doc
    for k in parents:
        target = target[k]
    if value is ...:
        del target[last]
    else:
        target[last] = value
    return doc


BAD_FIELDS = [
    (("paths",), ..., r": paths: missing"),
    (("paths",), {}, r": paths: expected a list"),
    (("paths", 1, "path_score"), "0.4", r": paths\[1\]\.path_score: expected a number, got '0\.4'"),
    (("paths", 0, "selected"), 1, r": paths\[0\]\.selected: expected true or false"),
    (("paths", 0, "nodes"), ["n1", 4], r": paths\[0\]\.nodes: expected a list of strings"),
    (("paths", 0, "leaf_reason"), "bored", r": paths\[0\]\.leaf_reason: expected one of token_limit"),
    (("paths", 1), "n3", r": paths\[1\]: expected a JSON object"),
    (("excluded", 0, "reason"), ..., r": excluded\[0\]\.reason: missing"),
    (("counts", "selected"), True, r": counts\.selected: expected an integer"),
    (("direction",), "up", r": direction: expected maximize or minimize"),
    (("root_score",), "2.31", r": root_score: expected a number or null"),
    (("version",), PATHS_VERSION + 1, r": paths version 2 is newer than this sftree's \(1\)"),
]


@pytest.mark.parametrize(
    ("where", "value", "named"),
    BAD_FIELDS,
    ids=[".".join(map(str, w)) + (" missing" if v is ... else f"={v!r}") for w, v, _ in BAD_FIELDS],
)
def test_a_bad_field_is_named_with_its_file(tmp_path, where, value, named):
    path = paths_path(tmp_path)
    path.write_text(json.dumps(_set(PATHS.to_doc(), where, value)), encoding="utf-8")
    with pytest.raises(InputError, match=named) as err:
        read_paths(path)
    assert f"selected paths file {path}" in str(err.value)


def test_a_file_that_is_not_a_paths_document_is_named(tmp_path):
    path = paths_path(tmp_path)
    path.write_text("[]", encoding="utf-8")
    with pytest.raises(InputError, match=r"paths\.json: the paths document is not a JSON object"):
        read_paths(path)
    path.write_text("{", encoding="utf-8")
    with pytest.raises(InputError, match=r"paths\.json"):
        read_paths(path)
