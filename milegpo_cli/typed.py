"""Typed validation of the config dataclasses from their type hints (``Literal`` choices, bool, int,
finite float, str, tuples, nested dataclasses): one validator for every recipe section, the
``[credit]`` section included (credit/config.py). Errors are one-line :class:`ConfigError` naming
the dotted key."""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Literal, Mapping

from milegpo_cli.errors import ConfigError


def coerce(hint: Any, value: Any, key: str) -> Any:
    """Check ``value`` against the type hint ``hint``; returns it converted (int -> float, list -> tuple)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"{key}: unsupported type {hint}")
        return coerce(inner[0], value, key)
    if origin is Literal:
        if value not in args:
            allowed = ", ".join(repr(a) for a in args)
            raise ConfigError(f"{key}: expected one of {allowed}, got {value!r}")
        return value
    if origin is tuple:
        if isinstance(value, str):  # `--set eval.splits=id` is the one-element list
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        item = args[0]
        return tuple(coerce(item, v, f"{key}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):  # already built (and checked)
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a table, got {value!r}")
        return build(hint, value, f"{key}.")
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected bool (true/false), got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected int, got {value!r}")
        if not -2**63 <= value < 2**63:  # what a store's 64-bit INTEGER column (and torch's seed) holds
            raise ConfigError(f"{key}: out of range (a 64-bit integer, |value| < 2^63), got {value}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected float, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{key}: expected a finite float, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected str, got {value!r}")
        return value
    raise TypeError(f"{key}: unsupported type {hint!r}")


def build(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    """Instantiate dataclass ``cls`` from ``data``; keys of nested dataclasses are dotted in errors."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    for key in data:
        if key not in names:
            raise ConfigError(f"unknown key '{prefix}{key}' (allowed: {', '.join(names)})")
    kwargs = {k: coerce(hints[k], v, f"{prefix}{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as err:  # __post_init__: "<field>: <reason>" (EnvError is a ValueError too)
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        head = msg.split(":", 1)[0].strip()
        section = prefix.rstrip(".") or "config"
        raise ConfigError(f"{prefix}{msg}" if head.split(".")[0] in names else f"{section}: {msg}") from None


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_fields(obj: Any, prefix: str = "") -> None:
    """Check every field of dataclass instance ``obj`` against its type hint, in place (a frozen
    dataclass too: an int where a float is expected becomes a float, a list a tuple)."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        object.__setattr__(obj, f.name, coerce(hints[f.name], getattr(obj, f.name), f"{prefix}{f.name}"))
