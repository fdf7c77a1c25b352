"""llama.cpp's chat templates and vocabularies (the llama.cpp sdist scripts/install_llm_server.sh unpacks into
~/.cache/sftree/llama.cpp-<version>/src), and the survey: the fixture's selected paths exported (merged) under every
tool-capable template there, per template its exit, records, adaptations and exclusions.

Run `python tests/helpers/templates.py` for the table docs/outputs.md shows (`SFTREE_LLAMA_SRC=DIR` names another
llama.cpp source tree)."""

from __future__ import annotations

import functools
import glob
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A template is tool-capable when it reads the tools or the messages' tool calls.
_TOOLS = re.compile(r"\btools\b|tool_calls")


def llama_models() -> Path | None:
    """llama.cpp's models/ folder (templates, ggml-vocab-*.gguf), or None where the sdist is absent."""
    roots = [os.environ.get("SFTREE_LLAMA_SRC", "")]
    cache = os.environ.get("SFTREE_CACHE") or os.path.expanduser("~/.cache/sftree")
    roots += sorted(glob.glob(f"{cache}/llama.cpp-*/src/llama.cpp"))
    for r in roots:
        if r and (Path(r) / "models/templates").is_dir():
            return Path(r) / "models"
    return None


def tool_templates(models: Path) -> list[Path]:
    return sorted(
        p for p in (models / "templates").glob("*.jinja") if _TOOLS.search(p.read_text(encoding="utf-8"))
    )


@dataclass(frozen=True)
class Survey:
    template: str
    error: str | None  # the export's error (None: exit 0)
    records: int
    adaptations: dict
    exclusions: dict
    family: str = ""


def survey(models: Path, paths: list[Path], templates: list[Path] | None = None) -> list[Survey]:
    """Each template's export of `paths` (merged) with Qwen2's vocabulary (what is tested is the render)."""
    from sftree.dataset.export import export_task
    from sftree.dataset.student import load_student, with_template
    from sftree.errors import InputError

    shared = load_student(models / "ggml-vocab-qwen2.gguf", 1_000_000)  # one tokenizer for every template
    out = []
    for t in templates if templates is not None else tool_templates(models):
        try:
            st = with_template(shared, t)
            records, stats = export_task(paths, "merged", student=st)
        except InputError as exc:
            out.append(Survey(t.stem, str(exc)[:300], 0, {}, {}))
            continue
        s = stats.student
        out.append(Survey(t.stem, None, len(records), dict(s.adaptations), dict(s.dropped), s.family))
    return out


def table(rows: list[Survey]) -> str:
    lines = ["| template | family | records | adaptations (records) | exclusions |", "|---|---|---:|---|---|"]
    for r in rows:

        def fmt(d: dict) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "-"

        if r.error:
            lines.append(f"| {r.template} | - | error | {r.error[:80]} | - |")
        else:
            lines.append(
                f"| {r.template} | {r.family} | {r.records} | {fmt(r.adaptations)} | {fmt(r.exclusions)} |"
            )
    return "\n".join(lines)


def fixture_paths(base: Path) -> list[Path]:
    """The export tests' tree (helpers/export.py) with its paths selected."""
    from helpers.export import make_results, paths_file

    return [paths_file(make_results(base / "results"))]


if __name__ == "__main__":
    sys.path[:0] = [str(Path(__file__).parents[1])]
    models = llama_models()
    if models is None:
        sys.exit("no llama.cpp source tree: run scripts/install_llm_server.sh (or set SFTREE_LLAMA_SRC)")
    with tempfile.TemporaryDirectory() as d:
        rows = survey(models, fixture_paths(Path(d)))
    print(table(rows))
    print(f"\n{sum(r.error is None for r in rows)} of {len(rows)} export", file=sys.stderr)


@functools.cache
def gguf_vocab(path: Path) -> Any:  # a tokenizers.Tokenizer
    """A GGUF's tokenizer as the Student loads it (`gguf_tokenizer`), read once per test process: Gemma 4's 262k
    tokens take 17 s or more to read, and two test files check it (every test line; special tokens)."""
    from sftree.dataset.student import gguf_tokenizer

    return gguf_tokenizer(path)
