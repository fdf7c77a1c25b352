"""Attempt records are parsed once per file version (coral.load_attempts), and an edit is always seen."""

from __future__ import annotations

import json
import os
import time

from sftree.runtime import coral


def _write(d, name, rec, age_s):
    p = d / name
    p.write_text(json.dumps(rec))
    t = time.time() - age_s
    os.utime(p, (t, t))
    return p


def test_cached_by_file_version_and_edits_are_seen(tmp_path, monkeypatch):
    coral._ATTEMPTS.clear()
    a = _write(tmp_path, "aaa.json", {"score": 1.0, "timestamp": "2026-01-02"}, 60)
    _write(tmp_path, "bbb.json", {"commit_hash": "bbb", "score": 2.0, "timestamp": "2026-01-01"}, 60)
    _write(tmp_path, "bad.json", "not an object", 60)
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "note.txt").write_text("{}")
    recent = tmp_path / "ccc.json"
    recent.write_text(json.dumps({"score": 3.0, "timestamp": "2026-01-03"}))
    got = coral.load_attempts(tmp_path)
    assert [(r["commit_hash"], r["score"]) for r in got] == [("bbb", 2.0), ("aaa", 1.0), ("ccc", 3.0)]
    assert coral._ATTEMPTS == {}  # files changed in the last seconds are not cached (racy)
    monkeypatch.setattr(coral, "_RACY_S", -1.0)  # as if they had all settled
    assert coral.load_attempts(tmp_path) == got and len(coral._ATTEMPTS) == 5
    monkeypatch.setattr(coral, "_parse_attempt", None)  # served from the cache alone now
    assert coral.load_attempts(tmp_path) == got
    monkeypatch.undo()
    monkeypatch.setattr(coral, "_RACY_S", -1.0)
    got[0]["score"] = 99  # a caller's copy: the cache is untouched
    assert coral.load_attempts(tmp_path)[0]["score"] == 2.0
    # same size, mtime set back: ctime still tells the file changed
    st = a.stat()
    a.write_text(json.dumps({"score": 7.0, "timestamp": "2026-01-02"}))
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert a.stat().st_size == st.st_size
    assert [r["score"] for r in coral.load_attempts(tmp_path)] == [2.0, 7.0, 3.0]
    assert coral.load_attempts(tmp_path / "missing") == []
