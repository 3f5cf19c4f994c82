"""Turning pydantic validation failures into one clear ConfigError (file, field, expected, found)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import pydantic

from simcore.errors import ConfigError

T = TypeVar("T")


def format_loc(loc: tuple[Any, ...], prefix: str = "") -> str:
    parts = [prefix] if prefix else []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        else:
            parts.append(str(item))
    return ".".join(parts)


def config_error_from_pydantic(
    exc: pydantic.ValidationError, *, source: str | Path | None, prefix: str = "", model: Any = None
) -> ConfigError:
    """The first error of a pydantic ValidationError, in the project's words."""
    err = exc.errors()[0]
    loc = tuple(err.get("loc", ()))
    where = format_loc(loc, prefix)
    kind = err.get("type", "")
    found = err.get("input")
    if kind == "extra_forbidden":
        known = _known_fields(model, loc[:-1]) if model is not None else []
        return ConfigError(
            "unknown key", source=str(source) if source else None, where=where,
            expected=f"one of {sorted(known)}" if known else "no such key", found=str(loc[-1]), choices=known,
        )
    if kind == "missing":
        return ConfigError("required key is missing", source=str(source) if source else None, where=where)
    msg = err.get("msg", "invalid value")
    if isinstance(found, (dict, list)):
        found = type(found).__name__
    return ConfigError(msg, source=str(source) if source else None, where=where, found=found)


def _known_fields(model: Any, loc: tuple[Any, ...]) -> list[str]:
    """Field names of the (possibly nested) pydantic model at `loc`, for did-you-mean hints."""
    current = model
    for item in loc:
        if isinstance(item, int) or current is None:
            continue
        fields = getattr(current, "model_fields", {})
        if item not in fields:
            # Tagged unions put the tag in the location; step over it.
            continue
        annotation = fields[item].annotation
        current = _first_model(annotation)
    return list(getattr(current, "model_fields", {}))


def _first_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def build_model_from_params(cls: type[T], params: dict, *, where: str, source: Any = None) -> T:
    """Build a plain dataclass from a YAML mapping, rejecting unknown keys with a hint."""
    import dataclasses

    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for key in params:
        if key not in names:
            raise ConfigError(
                "unknown key", source=str(source) if source else None, where=f"{where}.{key}",
                expected=f"one of {names}", found=str(key), choices=names,
            )
    try:
        return cls(**params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc), source=str(source) if source else None, where=where) from None
