"""``--set FIELD=VALUE``: any field of a chapter's profile (a dataclass, :class:`depthlib.contract.Profile`) set
from text, read as the field's type (nanoGPT's configurator idea, typed and validated by the dataclass): ints, floats,
bools, strings, ``none``, comma lists for tuples and Python literals for nested ones. A field is named by its dotted
path or by its name when that is unique; every dataclass changed is checked by its own ``validate()``. Bad input is
one :class:`~depthlib.errors.InputError` line naming the field and what it takes. The command line
(:mod:`depthlib.cli`) applies a command's ``--set`` and its chapter's own flags through :func:`apply_settings`."""
from __future__ import annotations

import ast
import dataclasses
import difflib
import json
import types
import typing
from typing import Any, Union

from depthlib.errors import InputError

__all__ = ["apply_settings", "settings_fields"]

_TRUE, _FALSE, _NONE = ("true", "yes", "on", "1"), ("false", "no", "off", "0"), ("none", "null")
_SCALARS = (bool, int, float, str)


def settings_fields(settings: Any, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Every field of the dataclass ``settings`` that holds a value, and of the dataclasses its fields hold:
    ``{dotted path: (type, current value)}``. The top level's ``name`` names a profile and is not a setting."""
    hints = typing.get_type_hints(type(settings))
    out: dict[str, tuple[Any, Any]] = {}
    for f in dataclasses.fields(settings):
        if not f.init or (not prefix and f.name == "name"):
            continue
        value = getattr(settings, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(settings_fields(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = (hints[f.name], value)
    return out


def _union(hint: Any) -> tuple[Any, ...] | None:
    """The members of a union type (``int | None``), or None for any other type."""
    return typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else None


def _element(hint: Any, current: Any) -> type | None:
    """The scalar type of a tuple field's elements: from ``tuple[int, ...]``, or, for a bare ``tuple``, from its
    current elements (a field of pairs, say, has none: it takes a literal)."""
    args = typing.get_args(hint)
    if len(args) == 2 and args[1] is Ellipsis:
        return args[0] if args[0] in _SCALARS else None
    if args or not current:
        return None
    kinds = {type(v) for v in current}
    if len(kinds) == 1 and next(iter(kinds)) in _SCALARS:
        return kinds.pop()
    return float if kinds <= {int, float} else None


def _kind(hint: Any, current: Any = None) -> str:
    """What a field of type ``hint`` takes, in words (what the one-line errors say)."""
    members = _union(hint)
    if members is not None:
        named = [_kind(m, current) for m in members if m is not type(None)]
        return " or ".join(named) + (" or none" if type(None) in members else "")
    words = {bool: "true or false", int: "an integer", float: "a number", str: "text"}
    if hint in words:
        return words[hint]
    if hint is tuple or typing.get_origin(hint) is tuple:
        element = _element(hint, current)
        if element is not None:
            plural = {bool: "true/false values", int: "integers", float: "numbers", str: "names"}[element]
            return f"comma-separated {plural}"
        example = json.dumps(current, default=str) if current else "[[0.0, 1.0], [1.0, 1.0]]"
        return f"a list like {example if len(example) <= 40 else example[:36] + ' ...'}"
    return f"a {getattr(hint, '__name__', hint)}"


def _like(sample: Any, value: Any) -> Any:
    """``value`` (read from a literal) with the types of ``sample``, an element of the field's current value."""
    if isinstance(sample, tuple) or (sample is None and isinstance(value, (list, tuple))):
        if not isinstance(value, (list, tuple)) or (sample is not None and len(value) != len(sample)):
            raise ValueError
        return tuple(_like(None if sample is None else sample[i], v) for i, v in enumerate(value))
    if sample is None:
        return value
    return _coerce(type(sample), value)


def _coerce(hint: Any, value: Any, current: Any = None) -> Any:
    """``value`` (read from a literal) as the type ``hint``, or ValueError: lists become tuples, integers floats
    where the field is a float, nested settings are rebuilt (:func:`depthlib.contract.from_dict`)."""
    from depthlib import contract
    members = _union(hint)
    if members is not None:
        if value is None and type(None) in members:
            return None
        for member in (m for m in members if m is not type(None)):
            try:
                return _coerce(member, value, current)
            except ValueError:
                continue
        raise ValueError
    if hint is bool or hint is str:
        if isinstance(value, hint):
            return value
        raise ValueError
    if hint is int or hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (hint is int and isinstance(value, float)):
            raise ValueError
        return hint(value)
    if hint is tuple or typing.get_origin(hint) is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v) for v in value)
        if args:
            if len(args) != len(value):
                raise ValueError
            return tuple(_coerce(a, v) for a, v in zip(args, value))
        return tuple(_like(current[0] if current else None, v) for v in value)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ValueError
        try:
            return contract.from_dict(hint, value, extra="forbid")
        except TypeError:
            raise ValueError from None
    return value


def _from_text(text: str, hint: Any, current: Any = None) -> Any:
    """``text`` (what follows ``FIELD=``) as a value of the field type ``hint`` (current value ``current``), or
    ValueError. Numbers and booleans as Python writes them; a tuple of scalars as comma-separated values
    (``depths=1,2,4``; empty: none); any other tuple as a Python or JSON literal (``cells=[[0.0, 1.0]]``); ``none``
    where the field may be None."""
    t = text.strip()
    members = _union(hint)
    if members is not None:
        if t.lower() in _NONE and type(None) in members:
            return None
        for member in (m for m in members if m is not type(None)):
            try:
                return _from_text(text, member, current)
            except ValueError:
                continue
        raise ValueError
    if hint is str:
        return text
    if hint is bool:
        if t.lower() in _TRUE + _FALSE:
            return t.lower() in _TRUE
        raise ValueError
    if hint is int:
        return int(t)
    if hint is float:
        return float(t)
    if hint is tuple or typing.get_origin(hint) is tuple:
        if t[:1] in ("[", "("):
            try:
                return _coerce(hint, ast.literal_eval(t), current)
            except (SyntaxError, TypeError, MemoryError, RecursionError):
                raise ValueError from None
        element = _element(hint, current)
        if element is None:
            raise ValueError
        return tuple(_from_text(v.strip(), element) for v in t.split(",")) if t else ()
    raise ValueError


def _resolve(fields: dict[str, tuple[Any, Any]], name: str, within: str | None, flag: str, owner: str) -> str:
    """The dotted path of the field ``name`` (a path, or the last name of exactly one field; ``within``: the fields
    under that path first, a part's settings)."""
    if name in fields:
        return name
    holders = [p for p in fields if p.startswith(name + ".")]
    if holders:
        example = next((h for h in holders if not h.endswith(".profile")), holders[0])
        raise InputError(f"{flag}: {name} holds settings of its own; set one of them, e.g. {example}=...")
    matches = [] if "." in name else [p for p in fields if p.rsplit(".", 1)[-1] == name]
    if within is not None:
        matches = [p for p in matches if p.startswith(within + ".")] or matches
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise InputError(f"{flag}: {len(matches)} fields are called {name!r} ({', '.join(matches)}); name one by its "
                         "path" + (" or choose --part" if within is None and "." in matches[0] else ""))
    close = difflib.get_close_matches(name, sorted(set(fields) | {p.rsplit(".", 1)[-1] for p in fields}), n=3)
    tops = sorted({p.split(".")[0] for p in fields})
    raise InputError(f"{flag}: {owner} has no field {name!r}; "
                     + (f"did you mean {' or '.join(close)}?" if close else f"its fields: {', '.join(tops)}"))


def _replaced(settings: Any, path: list[str], value: Any) -> Any:
    head, *rest = path
    return dataclasses.replace(settings, **{head: _replaced(getattr(settings, head), rest, value) if rest else value})


def apply_settings(settings: Any, assignments: list[tuple[str, str]], *, within: str | None = None,
                   owner: str | None = None) -> tuple[Any, tuple[str, ...]]:
    """``settings`` (a dataclass: a chapter's profile) with ``assignments`` applied, and the paths they changed.

    Each assignment is ``(flag, "FIELD=VALUE")`` (``flag`` names it in errors: ``--set sweep.steps``, or a chapter's
    own flag such as ``--depths``): FIELD is a dotted path or the name of exactly one field (those under ``within``,
    a part's settings, first); VALUE is read as the field's type (:func:`_from_text`). Every dataclass changed is then
    checked by its own ``validate()``, innermost first. Bad input is an :class:`InputError` of one line naming the
    field and what it takes."""
    owner = owner or f"{type(settings).__name__}"
    fields = settings_fields(settings)
    changes: dict[str, Any] = {}
    flags: dict[str, str] = {}
    for flag, item in assignments:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InputError(f"{flag} takes FIELD=VALUE, got {item!r}")
        path = _resolve(fields, name, within, flag if flag != "--set" else f"--set {name}", owner)
        hint, current = fields[path]
        where = flag if flag != "--set" else f"--set {path}"
        try:
            changes[path] = _from_text(text, hint, current)
        except ValueError:
            raise InputError(f"{where}: {path} takes {_kind(hint, current)}, got {text!r}") from None
        flags[path] = where
    out = settings
    for path, value in changes.items():
        try:
            out = _replaced(out, path.split("."), value)
        except (TypeError, ValueError) as err:
            raise InputError(f"{flags[path]}: {' '.join(str(err).split())}") from None
    prefixes = {".".join(p.split(".")[:i]) for p in changes for i in range(p.count(".") + 1)}
    for prefix in sorted(prefixes, key=lambda p: (-p.count("."), -len(p))):       # innermost first, the top last
        obj = out
        for part in filter(None, prefix.split(".")):
            obj = getattr(obj, part)
        if callable(getattr(obj, "validate", None)):
            try:
                obj.validate()
            except (TypeError, ValueError) as err:      # InputError too: said once more, naming the flags
                where = ", ".join(f for p, f in flags.items() if p.startswith(prefix))
                raise InputError(f"{where}: {' '.join(str(err).split())}") from None
    return out, tuple(changes)
