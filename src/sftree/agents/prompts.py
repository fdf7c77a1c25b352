"""The Teacher's prompts that are sftree's own: the native agent's system prompt and the turn record.

Coral's prompts (the start prompt, AGENTS.md, the turn and restart prompts) come from the tree's World
(`sftree.world.world.World`), which `search/edge.py` asks directly. The one template of sftree's own is `system.md`
(the native agent's system prompt, which carries AGENTS.md the way OpenCode's does), overridable by
`agent.prompts.system`; `turn_record` is the host's record of how a turn ended, from which the next turn's prompt
is built.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sftree.errors import InputError
from sftree.jsontypes import JSONObject

if TYPE_CHECKING:
    from sftree.settings import PromptSettings

TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "prompts"
NAMES = {"system": "system.md"}


def overrides(prompts: PromptSettings) -> dict[str, str | None]:
    """The file each template is read from as `agent.prompts` names it (None: sftree's own)."""
    return {"system": prompts.system}


def load_template(name: str, prompts: PromptSettings | None = None) -> str:
    """The template `name`: the file `agent.prompts` names for it, else sftree's own."""
    path = overrides(prompts).get(name) if prompts is not None else None
    p = Path(path) if path else TEMPLATE_DIR / NAMES[name]
    try:
        return p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"prompt template {name!r} ({p}) cannot be read: {exc}") from None


def render(name: str, prompts: PromptSettings | None = None, **values: object) -> str:
    return string.Template(load_template(name, prompts)).safe_substitute(
        {k: ("" if v is None else str(v)) for k, v in values.items()}
    )


class EvalRecord(Protocol):
    """A turn's first `coral eval` as the host recorded it (world/coral_command.py `EvalResult`)."""

    def to_dict(self) -> Mapping[str, object]: ...


def turn_record(ev: EvalRecord | None, ended: str) -> JSONObject:
    """The host's own record of how a turn ended: its first `coral eval` (EvalResult or None) and why it ended.

    The next turn's prompt is built from this alone, never from text in the session: the agent's tools can
    print anything, including a fake eval block (docs/security.md)."""
    return {"eval": ev.to_dict() if ev is not None else None, "ended": ended}
