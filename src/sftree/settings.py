"""The validated config as typed, frozen settings: one dataclass per section of workflow/schemas/config.schema.yaml.

    settings = load_settings(args.config)        # read, validate, fill in the schema's defaults, type
    settings.agent.quota.tmp_mib                 # an attribute, never `.get("tmp_mib", 256)`

The schema is the one place a default lives: `Settings.from_config` takes a config that `sftree.config` validated
and filled in, and a field here has no default of its own (a key the schema gives no default is Optional, None when
absent). tests/test_settings.py checks the fields against the schema's properties and that no code outside these
classes reads a config key with a default of its own.

Why a module of its own and not records/: records/ owns the files that cross a stage; the config is the user's
input, owned with its loader (config.py) at the package's top.

No dict of the config is kept beside the settings: every part is handed the sections it reads, typed.
"""

from __future__ import annotations

import copy
import dataclasses
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, Union, cast, get_args, get_origin, get_type_hints

from sftree.errors import InputError

JSONMap = Mapping[
    str, Any
]  # a section the schema leaves open (extra_body, a teacher-sim's options, a task entry)


@dataclass(frozen=True)
class ExampleRunSettings:
    count: int
    seed: int


@dataclass(frozen=True)
class ImportCoralSettings:
    shared_items: tuple[str, ...]


@dataclass(frozen=True)
class SelectRootsSettings:
    num_roots: int
    smooth_window: int
    link: str
    per_island: bool


@dataclass(frozen=True)
class TeacherSettings:
    base_url: str
    model: str
    api_key_env: str
    temperature: float
    top_p: float | None
    max_tokens: int
    request_timeout: float
    retries: int
    backoff_max: float
    backoff_base: float
    connect_timeout: float
    health_timeout: float
    outage_timeout: float
    context_tokens: int | None
    max_concurrency: int
    extra_body: JSONMap
    stream: bool
    first_chunk_timeout: float
    stall_timeout: float
    fleet_poll: float
    sim: JSONMap | None
    tool_choice: str
    constrain: str
    logprobs: int
    tokenizer: str | None
    seed: int | None
    launch: (
        JSONMap | None
    )  # teacher/llm_server.py `LaunchSpec.from_config` reads it (its defaults: repo paths)


@dataclass(frozen=True)
class CoralSettings:
    mode: str
    python: str | None
    grader_venv_cache: str | None


@dataclass(frozen=True)
class QuotaSettings:
    files: int
    mib: int
    file_mib: int
    depth: int
    tmp_mib: int
    tmp_inodes: int
    grade_mib: int
    grade_inodes: int


@dataclass(frozen=True)
class PromptSettings:
    system: str | None


@dataclass(frozen=True)
class OpenCodeSettings:
    binary: str
    disable_autocompact: bool
    context_limit: int | None


@dataclass(frozen=True)
class AgentSettings:
    backend: str
    student_model: str | None
    sandbox: str
    max_steps_per_turn: int
    max_request_mib_per_turn: int
    turn_timeout: float
    bash_timeout: float
    output_cap: int
    nudges: int
    run_dir: str
    quota: QuotaSettings
    prompts: PromptSettings
    opencode: OpenCodeSettings


@dataclass(frozen=True)
class SearchSettings:
    root_children: int
    max_children: int
    max_depth: int
    hard_token_limit: int
    target_good_leaves: int
    max_valid_edges: int
    max_failed_expansions: int
    prune_tool_error_rate: float
    alpha: float
    parallel_width: int
    schedule: str
    seed: int
    keep_workspaces: bool


@dataclass(frozen=True)
class SelectPathsSettings:
    top_k: int


@dataclass(frozen=True)
class StudentSettings:
    path: str
    max_length: int
    chat_template: str | None
    fit: str


@dataclass(frozen=True)
class ExportSettings:
    granularity: str
    dedupe: bool
    refuse_native: bool
    atif: bool
    tree_packed: bool
    tree_max_tokens: int
    student: StudentSettings | None
    special_text: str
    pretokenized: bool
    teacher_tokens: bool


@dataclass(frozen=True)
class Settings:
    snapshots: str
    results: str
    example_run: ExampleRunSettings | None
    tasks: Mapping[str, JSONMap]
    import_coral: ImportCoralSettings
    select_roots: SelectRootsSettings
    teacher: TeacherSettings
    coral: CoralSettings
    agent: AgentSettings
    search: SearchSettings
    select_paths: SelectPathsSettings
    export: ExportSettings

    @classmethod
    def from_config(cls, config: JSONMap) -> Settings:
        """From a config `sftree.config.validate_config` checked and filled in (a copy: later edits of the dict
        do not reach the settings)."""
        return _build(cls, copy.deepcopy(dict(config)), "config")


T = TypeVar("T")


def _dataclass_in(hint: object) -> type | None:
    """The settings class a field's type names (itself, or inside `X | None`), else None."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    if get_origin(hint) in (Union, types.UnionType):
        return next((a for a in get_args(hint) if isinstance(a, type) and dataclasses.is_dataclass(a)), None)
    return None


def _build(cls: type[T], data: JSONMap, where: str) -> T:
    """`cls` from one section: each field from the key of its name (absent: None, allowed only where the
    schema gives no default); a nested section built the same way; a list as a tuple (frozen)."""
    hints = get_type_hints(cls)
    values: dict[str, object] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        value = data.get(f.name)
        nested = _dataclass_in(hints[f.name])
        if nested is not None and isinstance(value, Mapping):
            value = _build(nested, value, f"{where}.{f.name}")
        elif isinstance(value, list):
            value = tuple(value)
        if value is None and type(None) not in get_args(hints[f.name]):
            raise InputError(f"{where}.{f.name}: missing (the config was not validated against the schema)")
        values[f.name] = value
    return cls(**values)


def load_settings(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Read a YAML config (default: the repository's config.yaml), merge overrides, validate, type."""
    from sftree.config import load_config

    return Settings.from_config(load_config(path, overrides))


def settings_of(config: JSONMap, source: str = "config") -> Settings:
    """Settings from a config dict not yet filled in (the Snakefile's, a test's): validated on a copy."""
    from sftree.config import validate_config

    return Settings.from_config(validate_config(copy.deepcopy(dict(config)), source))


_SECTIONS: dict[type, str] = {
    ImportCoralSettings: "import_coral",
    SelectRootsSettings: "select_roots",
    TeacherSettings: "teacher",
    CoralSettings: "coral",
    AgentSettings: "agent",
    SearchSettings: "search",
    SelectPathsSettings: "select_paths",
    ExportSettings: "export",
}


_DEFAULTS: dict[type, object] = {}


def schema_defaults(cls: type[T]) -> T:
    """One section's settings with the schema's defaults alone, read once: what a CLI offers by default and what
    a store or a grading takes where no config is given."""
    if cls not in _DEFAULTS:
        _DEFAULTS[cls] = section_settings(cls, {})
    return cast(T, _DEFAULTS[cls])


def section_settings(cls: type[T], values: JSONMap, source: str = "config") -> T:
    """One section's settings from its values alone (a tool's, a test's), the rest the schema's defaults."""
    from sftree.config import validate_section

    name = _SECTIONS[cls]
    return _build(cls, validate_section(name, copy.deepcopy(dict(values)), source), name)
