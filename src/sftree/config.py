"""Load `config.yaml`, validate it against workflow/schemas/config.schema.yaml and fill in defaults.

The Snakefile validates with `snakemake.utils.validate` (same schema); the CLI uses `load_config` so a rule run
by hand sees exactly the same settings.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeAlias

import jsonschema
import yaml

from sftree.errors import InputError

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = REPO_ROOT / "workflow" / "schemas"
CONFIG_SCHEMA = SCHEMA_DIR / "config.schema.yaml"

# A configuration as YAML gives it and the schema checks it (defaults filled in): its sections are read typed through
# sftree.settings; this is the raw document the schema validates and the rules pass on.
Config: TypeAlias = dict[str, Any]


def _with_defaults(
    validator_class: type[jsonschema.protocols.Validator],
) -> type[jsonschema.protocols.Validator]:
    """A validator that also fills `default` values, recursing into objects that get a default of {}."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(
        validator: jsonschema.protocols.Validator, properties: Config, instance: object, schema: Config
    ) -> Iterator[jsonschema.ValidationError]:
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    # types-jsonschema leaves validators.extend unannotated: the class it makes is a Validator like its base
    extended: type[jsonschema.protocols.Validator] = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
        validator_class, {"properties": set_defaults}
    )
    return extended


_Validator = _with_defaults(jsonschema.Draft202012Validator)


def load_schema(path: Path = CONFIG_SCHEMA) -> Config:
    with open(path, encoding="utf-8") as fh:
        schema: Config = yaml.safe_load(fh)
    return schema


def validate_config(config: Config, source: str = "config") -> Config:
    """Validate in place (filling defaults) and return the config; errors name the offending field."""
    _check(load_schema(), config, source, [])
    _check_backend_settings(config, source)
    return config


def validate_section(name: str, section: Config, source: str = "config") -> Config:
    """One top-level section (`coral`, `teacher`, ...) validated in place against its part of the schema, defaults
    filled in (sftree.settings `section_settings`: a section on its own, as a test or a tool builds one)."""
    _check(load_schema()["properties"][name], section, source, [name])
    return section


def _check(schema: Config, instance: Config, source: str, prefix: list[str]) -> None:
    errors = sorted(_Validator(schema).iter_errors(instance), key=lambda e: list(e.path))
    if errors:
        lines = [
            f"{source}: {'.'.join(str(p) for p in [*prefix, *e.path]) or '<top>'}: {_message(e)}"
            for e in errors
        ]
        if len(lines) == 1:
            raise InputError(f"invalid configuration: {lines[0]}")
        raise InputError("invalid configuration:\n  " + "\n  ".join(lines))


def _check_backend_settings(config: Config, source: str) -> None:
    """Settings one agent backend cannot honour are refused, not silently ignored: the OpenCode backend's requests
    are OpenCode's, passed on by the recording proxy, and a `response_format` grammar would turn every reply into
    JSON text OpenCode never runs as a call (docs/real_teacher.md); `tool_choice` the proxy does apply."""
    agent, teacher = config["agent"], config["teacher"]  # filled in by the schema's defaults
    if agent["backend"] == "opencode" and teacher["constrain"] != "none":
        raise InputError(
            f"invalid configuration: {source}: teacher.constrain: {teacher['constrain']!r} is applied by the native "
            "agent only (agent.backend: native); with agent.backend opencode set it to none (the proxy applies "
            "teacher.tool_choice, extra_body and the chat template's call form instead: docs/real_teacher.md)"
        )


def _message(err: jsonschema.ValidationError) -> str:
    """The error's message; for `anyOf` (a value that may be null or an object) the best branch's, which names
    the field that is wrong rather than "not valid under any of the given schemas"."""
    branch = [e for e in err.context or [] if e.validator != "type"]  # the branch of the value's own type
    if branch:
        best: str = jsonschema.exceptions.best_match(branch).message
        return best
    return err.message


def load_config(path: str | Path | None = None, overrides: Config | None = None) -> Config:
    """Read a YAML config (default: the repository's config.yaml), merge overrides, validate."""
    path = Path(path) if path else REPO_ROOT / "config.yaml"
    try:
        with open(path, encoding="utf-8") as fh:
            config = yaml.safe_load(fh) or {}
    except FileNotFoundError:
        raise InputError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(config, dict):
        raise InputError(f"config file {path}: top level must be a mapping")
    if overrides:
        config = deep_merge(config, overrides)
    return validate_config(config, source=str(path))


def deep_merge(base: Config, extra: Config) -> Config:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
