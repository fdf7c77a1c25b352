"""The config's typed settings (sftree.settings): one field per schema property, the schema the one source of
defaults, and no code that reads a config key with a default of its own."""

from __future__ import annotations

import ast
import dataclasses
import types
from pathlib import Path
from typing import Union, get_args, get_origin, get_type_hints

import pytest

from sftree.config import load_schema
from sftree.errors import InputError
from sftree.settings import CoralSettings, Settings, load_settings, section_settings, settings_of

SRC = Path(__file__).resolve().parents[1] / "src" / "sftree"
# `.get(key, default)` on dicts that are not the config, whose key is also a config key's name.
NOT_CONFIG = {
    ("records/tree.py", "depth"),  # a node's depth in tree.json
    ("agents/proxy.py", "tool_choice"),  # a request's body: extra_body's own tool_choice keeps the last word
}


def _optional(hint: object) -> bool:
    return get_origin(hint) in (Union, types.UnionType) and type(None) in get_args(hint)


def _nested(hint: object) -> type | None:
    args = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)
    return next((a for a in args if isinstance(a, type) and dataclasses.is_dataclass(a)), None)


def _object_schema(schema: dict) -> dict:
    """A section's object schema (an `anyOf` of null and an object: the object)."""
    return next((b for b in schema.get("anyOf", []) if b.get("type") == "object"), schema)


def _pairs(cls: type, schema: dict, where: str):
    """(where, field, its type, its schema) for every field of `cls` and of the sections inside it."""
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        sub = schema["properties"].get(f.name)
        yield f"{where}.{f.name}", f, hints[f.name], sub
        nested = _nested(hints[f.name])
        if nested is not None and sub is not None:
            yield from _pairs(nested, _object_schema(sub), f"{where}.{f.name}")


def test_settings_have_one_field_per_schema_property():
    def check(cls: type, schema: dict, where: str) -> None:
        names = {f.name for f in dataclasses.fields(cls)}
        assert names == set(schema["properties"]), where
        for f in dataclasses.fields(cls):
            nested = _nested(get_type_hints(cls)[f.name])
            if nested is not None:
                check(nested, _object_schema(schema["properties"][f.name]), f"{where}.{f.name}")

    check(Settings, load_schema(), "config")


def test_a_field_is_optional_exactly_where_the_schema_gives_no_value():
    """A default lives in the schema only: a field with a (non-null) default is never None; one with none, or a
    null default, is Optional. No field has a default of its own."""
    schema = load_schema()
    required = set(schema.get("required", []))
    for where, f, hint, sub in _pairs(Settings, schema, "config"):
        assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, where
        if where.startswith("config.export.student."):
            required = {"path", "max_length"}
        types_ = sub.get("type", [])
        nullable = "null" in (types_ if isinstance(types_, list) else [types_]) or any(
            b.get("type") == "null" for b in sub.get("anyOf", [])
        )
        has_value = (sub.get("default") is not None) or f.name in required
        assert _optional(hint) == (nullable or not has_value), f"{where}: Optional {_optional(hint)}"


def _config_keys_with_defaults() -> set[str]:
    keys: set[str] = set()

    def walk(s: dict) -> None:
        for k, v in (s.get("properties") or {}).items():
            if "default" in v:
                keys.add(k)
            walk(v)
        for b in s.get("anyOf", []):
            walk(b)

    walk(load_schema())
    return keys


def test_no_code_reads_a_config_key_with_its_own_default():
    keys, found = _config_keys_with_defaults(), []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in ("get", "setdefault") or len(node.args) != 2:
                continue
            key, default = node.args
            if not (isinstance(key, ast.Constant) and key.value in keys) or (rel, key.value) in NOT_CONFIG:
                continue
            if not (isinstance(default, ast.Constant) and default.value is None):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "config read with a default in code (the schema holds it):\n" + "\n".join(found)


def test_settings_carry_the_schemas_defaults():
    s = settings_of({"tasks": {"t": {"direction": "maximize", "grader": "true"}}})
    schema = load_schema()["properties"]
    assert s.agent.max_steps_per_turn == schema["agent"]["properties"]["max_steps_per_turn"]["default"]
    assert s.agent.quota.tmp_mib == schema["agent"]["properties"]["quota"]["properties"]["tmp_mib"]["default"]
    assert s.teacher.sim is None and s.export.student is None and s.example_run is None
    assert s.search.alpha == schema["search"]["properties"]["alpha"]["default"]


def test_settings_are_frozen():
    s = load_settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.agent.nudges = 5  # type: ignore[misc]


def test_a_bad_section_names_the_field():
    with pytest.raises(InputError, match=r"coral\.mode: 'x' is not one of"):
        section_settings(CoralSettings, {"mode": "x"})


def test_a_bad_config_names_the_file_and_field(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("tasks: {t: {direction: maximize, grader: 'true'}}\nagent: {max_steps_per_turn: 0}\n")
    with pytest.raises(InputError, match=rf"{path}: agent\.max_steps_per_turn: 0 is less than"):
        load_settings(path)


def _literal_defaults(tree: ast.AST):
    """(name, default, line) of every parameter, class field and command-line option given a default."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            pos = a.posonlyargs + a.args
            yield from (
                (p.arg, d, node.lineno)
                for p, d in zip(pos[len(pos) - len(a.defaults) :], a.defaults, strict=True)
            )
            yield from (
                (p.arg, d, node.lineno)
                for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
                if d is not None
            )
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            yield node.target.id, node.value, node.lineno
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            flag = next(
                (x.value for x in node.args if isinstance(x, ast.Constant) and str(x.value)[:2] == "--"), None
            )
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            if flag is not None and default is not None:  # a command-line option: `--top-k` reads as top_k
                yield flag[2:].replace("-", "_"), default, node.lineno


def _schema_defaults() -> dict[str, list[object]]:
    out: dict[str, list[object]] = {}

    def walk(s: dict) -> None:
        for k, v in (s.get("properties") or {}).items():
            if v.get("default") is not None and not isinstance(v["default"], dict | list):
                out.setdefault(k, []).append(v["default"])
            walk(v)
        for b in s.get("anyOf", []):
            walk(b)

    walk(load_schema())
    return out


# Parameters and fields named as a config key whose literal default is that key's schema default, left with the
# reason: a new one fails the test below.
SAME_VALUE_NOT_CONFIG = {
    ("roots/select_roots.py", "mode"): "a placer's link mode, not coral.mode",
    ("teacher/sim/policy.py", "seed"): "teacher-sim's own option, not search.seed",
    ("teacher/sim/server.py", "seed"): "teacher-sim's own option, not search.seed",
}


def test_no_parameter_or_field_repeats_a_schema_default():
    """A parameter or field named as a config key has no literal default equal to the schema's (a False switch
    is a flag left off, not a copy of the default)."""
    defaults, found = _schema_defaults(), []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for name, node, line in _literal_defaults(ast.parse(path.read_text(encoding="utf-8"))):
            if name not in defaults or not isinstance(node, ast.Constant) or node.value is False:
                continue
            if (rel, name) in SAME_VALUE_NOT_CONFIG:
                continue
            if any(
                node.value == d and isinstance(node.value, bool) == isinstance(d, bool)
                for d in defaults[name]
            ):
                found.append(f"{rel}:{line}: {name}={node.value!r}")
    assert not found, "a schema default repeated in code (take it from sftree.settings):\n" + "\n".join(found)
