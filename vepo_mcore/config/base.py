"""Generic plumbing for the dataclass config tree: dict/YAML <-> dataclass, dotted overrides.

Every section is a ``@dataclass(kw_only=True)``. Loading is strict: an unknown key or a value
of the wrong type raises a ValueError naming the dotted path (``model.num_layers``), so a typo
in a YAML file never silently falls back to a default.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

T = TypeVar("T")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, path: str) -> Any:
    """Convert a YAML/CLI value to the annotated type ``tp`` or raise a ValueError naming ``path``."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, path)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError(f"{path}: {value!r} matches none of {_type_name(tp)} ({'; '.join(errors)})")
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise ValueError(f"{path}: {value!r} is not one of {list(allowed)}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{path}: expected a mapping for section {tp.__name__}, got {value!r}")
        return from_dict(tp, value, path)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{path}: expected a list, got {value!r}")
        (item_tp, *_) = get_args(tp) or (Any,)
        items = [_convert(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{path}: expected a mapping, got {value!r}")
        key_tp, val_tp = get_args(tp) or (Any, Any)
        return {_convert(k, key_tp, path): _convert(v, val_tp, f"{path}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ValueError(f"{path}: expected true/false, got {value!r}")
    if tp in (int, float):
        # an int field takes no float (1.5 would truncate silently); YAML may give either as a string
        expected, accepted = ("an integer", (int, str)) if tp is int else ("a number", (int, float, str))
        if isinstance(value, bool) or not isinstance(value, accepted):
            raise ValueError(f"{path}: expected {expected}, got {value!r}")
        try:
            return tp(value)
        except ValueError:
            raise ValueError(f"{path}: expected {expected}, got {value!r}") from None
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ValueError(f"{path}: expected a string, got {value!r}")
        return str(value)
    return value


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_dict(cls: type[T], data: dict[str, Any], path: str = "") -> T:
    """Build dataclass ``cls`` from a nested dict; unknown keys raise a ValueError naming them."""
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    holder, registry = _sections_field(cls)
    sections = {}
    if holder is not None:  # its subsections are written inline: a mapping under a name that is no field
        names.discard(holder)
        sections = {k: v for k, v in data.items() if k not in names and isinstance(v, dict)}
    unknown = sorted(set(data) - names - set(sections))
    if unknown:
        where = path or cls.__name__
        close = [m for key in unknown for m in difflib.get_close_matches(str(key), names, n=1)]
        close += [f"{name}.{key}" for key in unknown for name, section in (registry or {}).items()
                  if key in {f.name for f in dataclasses.fields(section)}]  # fmt: skip
        hint = f"; did you mean {', '.join(repr(m) for m in close)}?" if close else ""
        raise ValueError(f"{where}: unknown key(s) {unknown}; known keys are {sorted(names)}{hint}")
    kwargs = {
        key: _convert(value, hints[key], f"{path}.{key}" if path else key)
        for key, value in data.items()
        if key not in sections
    }
    if holder is not None:
        kwargs[holder] = sections
    return cls(**kwargs)


def _sections_field(cls: type) -> tuple[str | None, dict[str, type] | None]:
    """(name, registry) of the field of `cls` that holds named subsections written inline, e.g.
    LossConfig.options: rl.loss.vepo.alpha is options['vepo'].alpha. Its metadata 'sections' is the
    registry of their dataclasses by name (filled at import by what defines them); the section class
    types and checks its subsections itself. (None, None) when `cls` has no such field."""
    for f in dataclasses.fields(cls):
        if "sections" in f.metadata:
            return f.name, f.metadata["sections"]
    return None, None


def to_dict(cfg: Any) -> Any:
    """Plain nested dict (lists, dicts, scalars) of a dataclass tree, ready for YAML/JSON."""
    if dataclasses.is_dataclass(cfg):
        out = {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.init}
        holder, _ = _sections_field(type(cfg))
        if holder is not None:  # written inline, as from_dict reads them
            out.update(out.pop(holder))
        return out
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _parse_value(raw: str) -> Any:
    """One override's text as YAML, except text YAML would misread: ':' (a YAML error) and '800:'
    (the mapping {800: None}) stay strings; a mapping on the command line is written {a: 1}. The
    field's type is checked afterwards either way."""
    if raw == "":
        return ""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    if isinstance(value, dict) and not raw.lstrip().startswith("{"):
        return raw
    return value


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``["--model.num_layers", "2", "--training.bf16=false"]`` -> nested dict of YAML-parsed values."""
    nested: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ValueError(f"override {arg!r}: expected --section.field VALUE")
        key = arg[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise ValueError(f"override --{key}: missing value")
            raw = args[i + 1]
            i += 2
        value = _parse_value(raw)
        node = nested
        parts = key.replace("-", "_").split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


def apply_overrides(cfg: T, overrides: list[str]) -> T:
    """``cfg`` with dotted CLI overrides applied to its effective values: a dotted key of a mapping
    field adds to or changes that mapping (--rl.rewards.weights.repetition 0.5 keeps mt, length,
    ...), where a mapping written in a file replaces the default one. Not validated."""
    return from_dict(type(cfg), _merge(to_dict(cfg), parse_overrides(overrides)))


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Load ``cls`` from an optional YAML file, apply dotted CLI overrides, and validate."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        with path.open() as f:
            try:
                loaded = yaml.safe_load(f) or {}
            except yaml.YAMLError as exc:
                raise ValueError(yaml_error_message(path, exc)) from None
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: top level must be a mapping of sections, got {type(loaded).__name__}")
        data = loaded
    cfg = from_dict(cls, data)
    if overrides:
        cfg = apply_overrides(cfg, overrides)
    validate = getattr(cfg, "validate", None)
    if validate is not None:
        validate()
    return cfg


def yaml_error_message(path: str | Path, exc: yaml.YAMLError) -> str:
    """'FILE: line 4, column 6: YAML syntax error: expected ',' or ']', but got ':' (while parsing a
    flow sequence from line 3, column 15)' from PyYAML's error (lines and columns from 1)."""
    mark = getattr(exc, "problem_mark", None)
    where = f"{path}: line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
    problem = getattr(exc, "problem", None) or str(exc)
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark:
        problem += f" ({context} from line {context_mark.line + 1}, column {context_mark.column + 1})"
    return f"{where}: YAML syntax error: {problem}"


def field_docs(cls: type) -> dict[str, str]:
    """{field name: its docstring} of a config dataclass (the string literal under each field)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # no source (a frozen build): no docs
        return {}
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def config_help(cls: type, sections: tuple[str, ...] | None = None, prefix: str = "") -> list[str]:
    """--help's listing of a config tree: a line per section (its docstring) and per field, as the
    dotted flag that sets it, its default and the first sentence of its docstring. `sections`: the
    top-level sections to list (default all)."""
    lines: list[str] = []
    docs = field_docs(cls)
    defaults = cls()
    for f in dataclasses.fields(cls):
        if not f.init or (sections is not None and not prefix and f.name not in sections):
            continue
        if "sections" in f.metadata:  # the registered subsections, each under its own name
            for name, section in sorted(f.metadata["sections"].items()):
                doc = " ".join((section.__doc__ or "").split()).split(". ")[0].rstrip(".")
                lines += [f"{prefix}{name}: {doc}", *config_help(section, prefix=f"{prefix}{name}.")]
            continue
        name, value = f"{prefix}{f.name}", getattr(defaults, f.name)
        doc = docs.get(f.name, "").split(". ")[0].rstrip(".")
        doc = doc if len(doc) <= 100 else doc[:97] + "..."
        if dataclasses.is_dataclass(value):
            lines += [f"{name}: {doc}", *config_help(type(value), prefix=f"{name}.")]
        else:
            shown = yaml.safe_dump(to_dict(value), default_flow_style=True, width=1 << 16).strip()
            shown = shown.removesuffix("...").strip()
            lines.append(f"  --{name} {shown}" + (f"  # {doc}" if doc else ""))
    return lines


def save_config(cfg: Any, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
