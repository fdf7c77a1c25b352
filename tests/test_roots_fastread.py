"""The fast reading path of select-roots gives exactly what the standard JSON parser gives, and the plot of a
long run is thinned without losing the chosen roots or the stage bands."""

import re

import pytest
from helpers.roots import commit_of, make_run

from sftree.errors import InputError
from sftree.records.stages import stages_text
from sftree.roots import select_roots, snapshots
from sftree.roots.snapshots import Scan, Snapshot

orjson = pytest.importorskip("orjson")  # a pinned dependency; without it only the standard parser runs


def _edit(path, old, new):
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def _odd_run(tmp_path):
    """Documents where the two parsers could part: each must read as the standard parser reads it."""
    folders = make_run(tmp_path / "t", [float(i) for i in range(12)])
    meta = [f / "metadata.json" for f in folders]
    att = [f / "shared" / "attempts" / f"{commit_of(i + 1)}.json" for i, f in enumerate(folders)]
    _edit(meta[0], '"eval_count": 1', '"eval_count": 1180591620717411303424')  # 2**70: a float to orjson
    _edit(meta[1], '"agent_id": "agent-2"', '"agent_id": 1180591620717411303424')
    _edit(att[2], '"status": "improved"', '"status": 1180591620717411303424')
    _edit(att[3], '"score": 3.0', '"score": 1e400')  # json: inf (non-finite), orjson: refused
    _edit(att[4], '"score": 4.0', '"score": NaN')
    _edit(att[5], '"score": 5.0', '"score": 100000000000000000000000000001')  # a big integer score
    _edit(
        meta[6],
        "{",
        '{"eval_ok": false, ',
    )  # a duplicate key: the last one counts
    _edit(meta[7], '"agent_id": "agent-4"', '"agent_id": "a\\ud800"')  # a lone surrogate: json only
    _edit(meta[8], f'"commit_hash": "{commit_of(9)}"', f'"commit_hash": " {commit_of(9)} "')
    short = att[9].with_name(f"{commit_of(10)[:10]}.json")  # found by a short file name
    att[9].rename(short)
    _edit(meta[10], '"eval_ok": true', '"eval_ok": true, "deep": [[[{"eval_ok": false}]]]')
    _edit(att[11], '"feedback": ""', '"feedback": "' + "x" * 70_000 + '"')  # longer than one read
    return tmp_path / "t"


def _scan(snaps, monkeypatch, fast):
    monkeypatch.setattr(snapshots, "FAST_MIN", 0)  # the fast loop for a small run too
    monkeypatch.setattr(snapshots, "_fast_loads", orjson.loads if fast else None)  # None: the standard parser
    return snapshots.scan(snaps, "t")


def test_fast_and_standard_parsers_read_alike(tmp_path, monkeypatch):
    snaps = _odd_run(tmp_path)
    fast, standard = _scan(snaps, monkeypatch, True), _scan(snaps, monkeypatch, False)
    assert fast.snapshots == standard.snapshots
    assert fast.non_finite == standard.non_finite == [p.name for p in sorted(snaps.iterdir())][3:5]
    got = {s.global_index: s for s in fast.snapshots}
    assert got[1].eval_count == 2**70 and type(got[1].eval_count) is int
    assert got[2].agent_id == str(2**70)
    assert got[3].status == 2**70
    assert got[4].score is None and got[5].score is None
    assert got[6].score == float(10**29 + 1)
    assert got[7].eval_ok is True and got[8].agent_id == "a\ud800" and got[9].commit_hash == commit_of(9)
    assert got[10].score == 9.0 and got[11].eval_ok is True and got[12].score == 11.0
    # and the standard parser really is the one the comparison ran against
    tables = [select_roots.stage_table(select_roots.select(s, "maximize", 4, 5)) for s in (fast, standard)]
    assert stages_text(tables[0]) == stages_text(tables[1])


@pytest.mark.parametrize(
    "old, new, words",
    [
        ('"eval_ok": true', '"eval_ok": 1180591620717411303424', "eval_ok must be true or false, not 1180591620717411303424"),
        ('"eval_ok": true', '"eval_ok": true,', "is not valid JSON"),
        ('"eval_ok": true}', '"eval_ok": tr', "is not valid JSON"),  # a truncated file
        ('"commit_hash": "', '"commit_hash": 7, "x": "', "commit_hash is missing or not a plain string: 7"),
    ],
)  # fmt: skip
def test_bad_metadata_names_file_and_field_on_both_paths(tmp_path, monkeypatch, old, new, words):
    folders = make_run(tmp_path / "t", [1.0, 2.0, 3.0])
    _edit(folders[1] / "metadata.json", old, new)
    messages = []
    for fast in (True, False):
        with pytest.raises(InputError) as err:
            _scan(tmp_path / "t", monkeypatch, fast)
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert words in messages[0] and str(folders[1] / "metadata.json") in messages[0]


def _selection(n):
    """A long run in memory (no files: the plot reads only the selection): a rising noisy curve with failures."""
    snaps = [
        Snapshot(f"eval-{i:06d}-a-abcdef", "/x", i, "a", "abcdef", i % 20 != 7,
                 (1 - 1 / (1 + 8 * i / n)) + ((i * 7919) % 101 - 50) / 1000 if i % 20 != 7 else None, "s", i)
        for i in range(1, n + 1)
    ]  # fmt: skip
    return select_roots.select(Scan("t", "/x", snaps), "maximize", 30, 5)


def test_plot_of_a_long_run_keeps_roots_and_bands_and_stays_small():
    sel = _selection(40_000)
    svg = select_roots.plot_svg(sel)
    assert len(svg) < 400_000  # every point drawn, it is 3.5 MB
    assert "40,000 snapshots" in svg and "lowest and highest value of each pixel column" in svg
    # every chosen root is drawn: ring x positions are the chosen global indices mapped on the axis
    rings = [float(x) for x in re.findall(r'<circle cx="([\d.]+)" cy="[\d.]+" r="5.5"', svg)]
    x_lo, x_hi, left, width = 0.5, 40_000.5, 70, 860 - 70 - 170
    want = [round(left + (r.snap.global_index - x_lo) / (x_hi - x_lo) * width, 1) for r in sel.chosen]
    assert len(sel.chosen) == 30 and rings == want
    # the stage bands: one per run of consecutive snapshots in one stage, at the same place as before thinning
    stages = [r.stage for r in sel.rows]
    runs = 1 + sum(a != b for a, b in zip(stages, stages[1:], strict=False))
    bands = re.findall(
        r'<rect x="([\d.]+)" y="36" width="([\d.]+)" height="334" fill="#[0-9a-f]+" fill-opacity="0.14"', svg
    )
    assert len(bands) == runs and float(bands[0][0]) == left
    assert sum(float(w) for _, w in bands) == pytest.approx(width, abs=0.1 * runs)
    # the red crosses: at most two per pixel column (plus the first and last)
    assert svg.count("<path d=") <= 2 * width + 2 + 1


DOCS = [
    b'{"a":1,"a":2}', b'{"x":1e400}', b'{"x":NaN}', b'{"x":-Infinity}', b'{"x":1,}', b'{"x":"\x01"}',
    b'{"x":"\\ud800"}', b'\xef\xbb\xbf{"x":1}', b' {"x":1} \n', b'{"x":1} x', b"{'x':1}", b'{"x":01}',
    b'{"x":.5}', b'{"x":"\xff"}', b'{"x":"\xed\xa0\x80"}', b'\x0c{"x":1}', b'{"x":1}\xc2\xa0', b'[1]', b'',
    b'{"x":-0.0, "y": 0.1, "z": 2.2250738585072011e-308, "w": 4.9e-324, "v": 1.7976931348623157e308}',
    b'{"x": [1, {"y": null}], "t": true, "f": false, "s": "\\u00e9\xe2\x80\xa8"}', b'{"x":9223372036854775807}',
]  # fmt: skip


def _parsed(loads, doc):
    try:
        return repr(loads(doc))
    except ValueError:
        return "refused"


@pytest.mark.parametrize("doc", DOCS)
def test_orjson_reads_as_the_standard_parser_or_refuses(doc):
    """The fast loop's premise: what orjson accepts, the standard parser reads the same; the rest is read again
    by the standard parser (`read_snapshot`)."""
    fast, standard = _parsed(orjson.loads, doc), _parsed(snapshots._std_loads, doc)
    assert fast in ("refused", standard)


def test_a_small_run_does_not_import_orjson(tmp_path, monkeypatch):
    make_run(tmp_path / "t", [1.0, 2.0, 3.0])
    monkeypatch.setattr(snapshots, "_fast_loads", snapshots._UNSET)
    snapshots.scan(tmp_path / "t", "t")
    assert (
        snapshots._fast_loads is snapshots._UNSET
    )  # below FAST_MIN folders the import costs more than it saves
    monkeypatch.setattr(snapshots, "FAST_MIN", 3)
    snapshots.scan(tmp_path / "t", "t")
    assert snapshots._fast_loads is orjson.loads
