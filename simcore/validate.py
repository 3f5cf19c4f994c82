"""Bad input, in the project's words: one ConfigError naming file, field, expected and found.

- `config_error_from_pydantic`: the first problem of a pydantic ValidationError, with the field
  path as the user wrote it (pydantic's union tags such as `poisson` or `str` are left out), what
  was expected (valid names, ranges, types) and a close match for misspellings.
- `load_yaml_mapping` / `parse_yaml`: YAML as Python data; syntax errors and duplicate keys name
  their line and column, a non-UTF-8 file or a folder is named as such. A file may hold at most
  MAX_YAML_CHARS characters, also once every alias is written out (a "billion laughs" file of
  nested aliases is refused before anything reads its values), and no alias may contain itself.
- `load_yaml_text`: the same limits for YAML read elsewhere (calibration files, flag values),
  as a drop-in for `yaml.safe_load` whose refusals are `yaml.YAMLError`s.
- `apply_override` / `set_path`: one `--set key.path=value` onto a loaded mapping; a path through
  a scalar, a bad list index or a value that is not YAML is a ConfigError.
- `build_model_from_params`: a plain dataclass from a YAML mapping (cost-model parameters),
  rejecting unknown keys and values of the wrong type.
- `suggest`: the did-you-mean hint (case, dashes and prefixes before spelling: h100 -> h100-sxm).
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union

import pydantic
import yaml

from simcore.errors import ConfigError, close_match, cut, short_repr

T = TypeVar("T")

# --- pydantic errors --------------------------------------------------------------------------

# What a type error expected, by the pydantic error type's prefix.
_TYPE_WORDS = {
    "string": "a string",
    "int": "a whole number",
    "float": "a number",
    "decimal": "a number",
    "bool": "true or false",
    "list": "a list",
    "tuple": "a list",
    "set": "a list",
    "dict": "a mapping (key: value)",
    "model": "a mapping (key: value)",
    "model_attributes": "a mapping (key: value)",
    "dataclass": "a mapping (key: value)",
    "none_required": "nothing (null)",
}
_RANGE_TYPES = ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "multiple_of")
# Errors looked at for the members of a plain union: they come first and together, and a value
# with a million bad items must not cost a schema walk per item.
_MAX_ERRORS_SCANNED = 100
# A validator's own message quotes the value it refused; a long value is cut to this.
_MAX_MESSAGE_CHARS = 500


class _Shown:
    """A `found` value shown as plain words (ConfigError prints found with repr)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def config_error_from_pydantic(
    exc: pydantic.ValidationError, *, source: str | Path | None, prefix: str = "", model: Any = None
) -> ConfigError:
    """The problems of a pydantic ValidationError as one ConfigError: the most helpful first, on
    the message's first line, then each problem at another place on a line of its own (at most
    MAX_REPORTED_ERRORS), so a file with several mistakes is fixed in one round."""
    all_errors = exc.errors(include_url=False)
    errors = all_errors[:_MAX_ERRORS_SCANNED]
    first = _most_helpful(errors)
    # Errors at one place are the members of a plain union (e.g. `str | list[str]`): said together.
    at_place: dict[str, list[dict]] = {}
    # One problem a place, where the items of one list count as one place (200,000 bad values
    # are one mistake, said once): its first error and where that is.
    leads: dict[str, tuple[dict, tuple]] = {}
    for err in [first, *(e for e in errors if e is not first)]:
        walked = _walk(model, tuple(err.get("loc", ())))
        at_place.setdefault(repr(walked[0]), []).append(err)
        leads.setdefault(repr([p if isinstance(p, str) else "[]" for p in walked[0]]), (err, walked))
    source_text = str(source) if source else None
    problems = [
        _convert(lead, at_place[repr(walked[0])], *walked, source=source_text, prefix=prefix)
        for lead, walked in leads.values()
        # (`rate` missing, when `rat` was written: the hint on `rat` says it)
        if lead is first or not _is_a_misspelling(lead, first)
    ]
    if len(problems) == 1:
        return problems[0]
    text = str(problems[0])
    shown = 1
    for problem in problems[1:MAX_REPORTED_ERRORS]:
        line = f"\n  also: {problem}"
        if len(text) + len(line) > MAX_REPORTED_CHARS:
            break
        text += line
        shown += 1
    if len(all_errors) > len(errors):
        text += "\n  (and more)"
    elif shown < len(problems):
        text += f"\n  ({len(problems) - shown} more)"
    error = ConfigError(text)
    error.source, error.where = problems[0].source, problems[0].where
    return error


# Most problems, and characters, one config error lists (the rest are counted).
MAX_REPORTED_ERRORS = 10
MAX_REPORTED_CHARS = 1500


def _is_a_misspelling(missing: dict, unknown: dict) -> bool:
    """Whether `missing` is a required key that the unknown key `unknown` was meant to be."""
    return missing.get("type") == "missing" and unknown.get("type") == "extra_forbidden" and \
        tuple(missing.get("loc", ()))[:-1] == tuple(unknown.get("loc", ()))[:-1]


def _most_helpful(errors: list[dict]) -> dict:
    """The error to report: the first, except that a misspelt key beats the key it was meant to be
    (`rat: 3` is reported as an unknown key with a hint, not as `rate` missing)."""
    first = errors[0]
    if first.get("type") == "missing":
        parent = tuple(first.get("loc", ()))[:-1]
        for err in errors:
            loc = tuple(err.get("loc", ()))
            if err.get("type") == "extra_forbidden" and loc[:-1] == parent:
                return err
    return first


def _convert(err: dict, same: list[dict], parts: list, ann: Any, parent: Any, *, source: str | None,
             prefix: str) -> ConfigError:
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    value = err.get("input")
    where = format_loc(tuple(parts), prefix) or None
    msg = str(err.get("msg", "invalid value"))

    if kind == "extra_forbidden":
        known = _field_names(parent)
        return _error("unknown key", source=source, where=where, expected=f"one of {known}" if known else "no key here",
                      found=str(parts[-1]) if parts else None, choices=known)
    if kind == "missing":
        if parts and isinstance(parts[-1], int):
            expected = _tuple_length(parent)
            return ConfigError("too few items", source=source, where=format_loc(tuple(parts[:-1]), prefix) or None,
                               expected=f"{expected} items" if expected else None)
        return ConfigError("required key is missing", source=source, where=where, expected=_describe_type(ann))
    if kind in ("union_tag_invalid", "union_tag_not_found", "trace_format"):
        return _tag_error(kind, ctx, value, parts, ann, source=source, prefix=prefix)
    if kind == "literal_error":
        choices = re.findall(r"'((?:[^'\\]|\\.)*)'", str(ctx.get("expected", "")))
        return _error("invalid value", source=source, where=where,
                      expected=f"one of {choices}" if choices else str(ctx.get("expected")), found=value,
                      choices=choices)
    if kind == "int_parsing_size":
        return ConfigError("number too large", source=source, where=where, expected=_describe_type(ann),
                           found=_found(value))
    if kind in _RANGE_TYPES or kind == "finite_number":
        expected = _range_text(parent, parts, ann, ctx, kind)
        problem = "not a finite number" if _is_nonfinite(value) else "out of range"
        return ConfigError(problem, source=source, where=where, expected=expected, found=_found(value))
    if kind in ("too_short", "too_long"):
        low, high = ctx.get("min_length"), ctx.get("max_length")
        expected = f"at least {low} item(s)" if kind == "too_short" else f"at most {high} item(s)"
        return ConfigError("too few items" if kind == "too_short" else "too many items", source=source,
                           where=where, expected=expected, found=_Shown(str(ctx.get("actual_length", "?"))))
    if kind == "float_type" and _is_nonfinite(value):  # a whole number past the float range
        return ConfigError("not a finite number", source=source, where=where,
                           expected=_range_text(parent, parts, ann, ctx, kind), found=_found(value))
    expected_type = _type_expected(kind)
    if expected_type is not None:
        others = [_type_expected(e.get("type", "")) for e in same]
        words = list(dict.fromkeys(w for w in [expected_type, *others] if w))
        return ConfigError("wrong type", source=source, where=where, expected=" or ".join(words),
                           found=_found(value))
    # value_error from a validator, or a custom error raised by the schema's own checks.
    msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    msg = cut(msg, _MAX_MESSAGE_CHARS)
    choices = re.findall(r"'([^']*)'", msg) if isinstance(value, str) else []
    hint = suggest(value, [c for c in choices if c != value]) if choices else None
    if hint:
        msg += f" (did you mean {hint!r}?)"
    return ConfigError(msg, source=source, where=where)


def _error(message: str, *, source: str | None, where: str | None, expected: str | None, found: Any,
           choices: Any) -> ConfigError:
    """A ConfigError whose did-you-mean hint comes from `suggest` (case, dashes, prefixes, spelling)."""
    hint = suggest(found, choices) if isinstance(found, str) and choices else None
    text = message
    if expected is not None:
        text += f"; expected {expected}"
    if found is not None:
        text += f", found {short_repr(_found(found))}"
    if hint:
        text += f" (did you mean {hint!r}?)"
    return ConfigError(text, source=source, where=where)


def suggest(word: str, choices: Any) -> str | None:
    """The choice a misspelt `word` most likely meant (see simcore.errors.close_match)."""
    return close_match(word, choices)


def _tag_error(kind: str, ctx: dict, value: Any, parts: list, ann: Any, *, source: str | None,
               prefix: str) -> ConfigError:
    """A discriminated union (policy name, distribution kind, trace format) with a bad or no tag."""
    tags = _union_tags(ann)
    if kind == "trace_format":
        key = "format"
    else:
        key = str(ctx.get("discriminator", "")).strip("'") or "kind"
        if not tags:
            tags = re.findall(r"'([^']*)'", str(ctx.get("expected_tags", "")))
    where = format_loc((*parts, key), prefix)
    noun = _noun(parts, key)
    expected = f"one of {tags}" if tags else None
    given = value.get(key) if isinstance(value, dict) else None
    if kind == "union_tag_not_found" or (kind == "trace_format" and given is None):
        return ConfigError(f"required key is missing (the {noun})", source=source, where=where, expected=expected)
    if kind == "union_tag_invalid" and not isinstance(value, dict):
        given = ctx.get("tag", given)
    return _error(f"unknown {noun}", source=source, where=where, expected=expected, found=given, choices=tags)


def _noun(parts: list, key: str) -> str:
    names = [p for p in parts if isinstance(p, str)]
    if names and names[0] == "policies" and len(names) == 1:
        return f"policy {key}"
    if names:
        return f"{names[-1]} {key}"
    return key


def _type_expected(kind: str) -> str | None:
    """What a type error (int_parsing, int_from_float, float_type, model_attributes_type...) expected."""
    if not (kind.endswith(("_type", "_parsing")) or kind == "int_from_float"):
        return None
    for prefix_, words in sorted(_TYPE_WORDS.items(), key=lambda kv: -len(kv[0])):
        if kind.startswith(prefix_ + "_"):
            return words
    return None


def _found(value: Any) -> Any:
    if isinstance(value, dict):
        return _Shown("a mapping")
    if isinstance(value, (list, tuple)):
        return _Shown(f"a list of {len(value)}")
    if value is None:
        return _Shown("null")
    if isinstance(value, str) and len(value) > 60:
        return _Shown(repr(value[:57] + "..."))
    return value


def _is_nonfinite(value: Any) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) > sys.float_info.max
    return isinstance(value, float) and not math.isfinite(value)


def _range_text(parent: Any, parts: list, ann: Any, ctx: dict, kind: str) -> str:
    """'a number in (0, 1]' from the field's own bounds, else from the error's context."""
    bounds = dict(ctx)
    field = _field_info(parent, parts[-1] if parts else None)
    is_int = _base_type(ann) is int
    if field is not None:
        for meta in field.metadata:
            for name in ("gt", "ge", "lt", "le"):
                if getattr(meta, name, None) is not None:
                    bounds[name] = getattr(meta, name)
        is_int = is_int or _base_type(field.annotation) is int
    noun = "a whole number" if is_int else "a finite number"
    low = f"> {bounds['gt']}" if "gt" in bounds else f">= {bounds['ge']}" if "ge" in bounds else None
    high = f"< {bounds['lt']}" if "lt" in bounds else f"<= {bounds['le']}" if "le" in bounds else None
    if low and high:
        left = "(" if "gt" in bounds else "["
        right = ")" if "lt" in bounds else "]"
        return f"{noun} in {left}{bounds.get('gt', bounds.get('ge'))}, {bounds.get('lt', bounds.get('le'))}{right}"
    if kind == "multiple_of":
        return f"a multiple of {bounds.get('multiple_of')}"
    return f"{noun} {low or high}" if (low or high) else noun


def format_loc(loc: tuple[Any, ...], prefix: str = "") -> str:
    """`policies[0].chunk_size` from ('policies', 0, 'chunk_size')."""
    parts = [prefix] if prefix else []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        else:
            parts.append(cut(str(item), 100))  # a key as the input spelt it, however long
    return ".".join(parts)


# --- walking a pydantic location through the schema --------------------------------------------


def _walk(model: Any, loc: tuple[Any, ...]) -> tuple[list, Any, Any]:
    """(path parts without union tags, annotation at the end, model holding the last part)."""
    parts: list = []
    ann: Any = model
    parent: Any = None
    i = 0
    while i < len(loc):
        item = loc[i]
        ann = _strip_optional(ann)
        members = _union_members(ann)
        if members is not None:
            chosen = _member_for_tag(ann, members, item)
            if chosen is not _NO_MATCH:
                ann = chosen
                i += 1
                continue
            ann = None
        base = _unannotated(ann)
        if isinstance(base, type) and issubclass(base, pydantic.BaseModel):
            parent = base
            if isinstance(item, str) and item in base.model_fields:
                parts.append(item)
                ann = _field_annotation(base.model_fields[item])
            else:
                parts.append(item)
                ann = None
        elif typing.get_origin(base) in (list, tuple, set, frozenset) and isinstance(item, int):
            parent = base
            parts.append(item)
            args = typing.get_args(base)
            if typing.get_origin(base) is tuple and args and args[-1] is not Ellipsis:
                ann = args[item] if item < len(args) else None
            else:
                ann = args[0] if args else None
        elif typing.get_origin(base) is dict:
            parent = base
            if i + 1 < len(loc) and loc[i + 1] == "[key]":
                parts.append(item)
                ann = None
                i += 2
                continue
            parts.append(item)
            args = typing.get_args(base)
            ann = args[1] if len(args) == 2 else None
        elif item != "[key]":
            parts.append(item)
            ann = None
        i += 1
    return parts, ann, parent


_NO_MATCH = object()


class _Discriminated:
    """Stands in Annotated metadata for a discriminator pydantic moved onto the FieldInfo."""

    def __init__(self, discriminator: Any) -> None:
        self.discriminator = discriminator


def _field_annotation(field: Any) -> Any:
    """A field's annotation, with its discriminator put back (`x: Annotated[A | B, Field(discriminator=...)]`
    keeps it on the FieldInfo, not in the annotation)."""
    ann = field.annotation
    if field.discriminator is not None:
        ann = Annotated[ann, _Discriminated(field.discriminator)]
    return ann


def _unannotated(ann: Any) -> Any:
    while typing.get_origin(ann) is Annotated:
        ann = typing.get_args(ann)[0]
    return ann


def _strip_optional(ann: Any) -> Any:
    """X | None -> X (keeping X's Annotated metadata)."""
    base = _unannotated(ann)
    if _is_union(base):
        args = [a for a in typing.get_args(base) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(base)) == 2:
            return args[0]
    return ann


def _is_union(ann: Any) -> bool:
    return typing.get_origin(ann) in (Union, types.UnionType)


def _union_members(ann: Any) -> list | None:
    base = _unannotated(ann)
    if not _is_union(base):
        return None
    members = [a for a in typing.get_args(base) if a is not type(None)]
    return members if len(members) > 1 else None


def _discriminator_key(ann: Any) -> str | None:
    for meta in getattr(ann, "__metadata__", ()):
        key = getattr(meta, "discriminator", None)
        if isinstance(key, str):
            return key
    return None


def _member_tags(member: Any, key: str | None) -> list[str]:
    tags = [m.tag for m in getattr(member, "__metadata__", ()) if isinstance(m, pydantic.Tag)]
    if tags:
        return tags
    base = _unannotated(member)
    if key and isinstance(base, type) and issubclass(base, pydantic.BaseModel) and key in base.model_fields:
        literal = _unannotated(base.model_fields[key].annotation)
        if typing.get_origin(literal) is Literal:
            return [str(v) for v in typing.get_args(literal)]
    return []


def _union_tags(ann: Any) -> list[str]:
    ann = _strip_optional(ann)
    members = _union_members(ann) or []
    key = _discriminator_key(ann)
    return [t for m in members for t in _member_tags(m, key)]


def _member_for_tag(ann: Any, members: list, item: Any) -> Any:
    key = _discriminator_key(ann)
    for member in members:
        if item in _member_tags(member, key):
            return member
    if key is None and not any(_member_tags(m, None) for m in members):
        # A plain (smart-mode) union: pydantic puts the member's type name in the location.
        for member in members:
            base = _unannotated(member)
            if item in (getattr(base, "__name__", None), _type_label(base)):
                return member
        if isinstance(item, str) and (item in ("str", "int", "float", "bool", "none") or "[" in item):
            return None
    return _NO_MATCH


def _type_label(ann: Any) -> str:
    origin = typing.get_origin(ann)
    if origin is None:
        return getattr(ann, "__name__", str(ann))
    args = ",".join(_type_label(a) for a in typing.get_args(ann))
    return f"{getattr(origin, '__name__', origin)}[{args}]"


def _base_type(ann: Any) -> Any:
    return _unannotated(_strip_optional(ann))


def _field_names(model: Any) -> list[str]:
    return list(getattr(model, "model_fields", {}) or {})


def _field_info(model: Any, name: Any) -> Any:
    fields = getattr(model, "model_fields", None)
    return fields.get(name) if fields and isinstance(name, str) else None


def _tuple_length(ann: Any) -> int | None:
    if typing.get_origin(ann) is tuple:
        args = typing.get_args(ann)
        return len(args) if args and args[-1] is not Ellipsis else None
    return None


def _describe_type(ann: Any) -> str | None:
    base = _base_type(ann)
    if base is None:
        return None
    if _union_members(_strip_optional(ann)) is not None:
        tags = _union_tags(ann)
        return f"a mapping with one of {tags}" if tags else None
    if isinstance(base, type) and issubclass(base, pydantic.BaseModel):
        return "a mapping (key: value)"
    words = {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}
    return words.get(base)


# --- YAML files and --set overrides ------------------------------------------------------------


# Most characters a YAML text may have, also counted with every alias (*name) written out as its
# anchor's value. Experiment files are a few kilobytes; PyYAML reads about 250 KB a second, so a
# file at the limit takes some 15 s. Counting aliases out bounds what reading the values costs
# afterwards (validating, copying sweep points, hashing, messages): a "billion laughs" file of
# 700 bytes whose nested aliases stand for 10**9 values is refused before any of that.
MAX_YAML_CHARS = 4 * 2**20
# Deepest nesting of lists and mappings a YAML input may have: an experiment file needs about 8,
# and what reads the values (deepcopy, pydantic, json) recurses once or twice per level.
MAX_YAML_DEPTH = 100


class YamlLimitError(yaml.MarkedYAMLError):
    """A YAML text past MAX_YAML_CHARS, as written or with its aliases written out, or nested
    past MAX_YAML_DEPTH. A yaml.YAMLError, so callers of `yaml.safe_load` catch it too."""

    def __init__(self, problem: str, problem_mark: yaml.Mark | None = None, *, kind: str = "YAML too large") -> None:
        super().__init__(problem=problem, problem_mark=problem_mark)
        self.kind = kind


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader with `max_chars` (MAX_YAML_CHARS unless told) as a limit on the text and on
    its aliases' expansion, and MAX_YAML_DEPTH on its nesting, checked on the composed nodes
    before any value is built."""

    def __init__(self, stream: Any, max_chars: int = MAX_YAML_CHARS) -> None:
        if isinstance(stream, (str, bytes)) and len(stream) > max_chars:
            raise YamlLimitError(f"the text has {len(stream):,} characters, more than the "
                                 f"{max_chars:,} a YAML input may have")
        super().__init__(stream)
        self.max_chars = max_chars

    def compose_document(self) -> Any:
        try:
            node = super().compose_document()
        except RecursionError:
            raise YamlLimitError(f"lists and mappings nested too deeply (at most {MAX_YAML_DEPTH} levels)",
                                 kind="YAML too deep") from None
        check_expanded_size(node, self.max_chars)
        return node


def _node_children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def check_expanded_size(root: yaml.Node | None, limit: int = MAX_YAML_CHARS, max_depth: int = MAX_YAML_DEPTH) -> None:
    """Refuse a node graph that, with every alias written out, passes `limit` characters (a
    scalar counts its text and a separator, a list or mapping its two brackets) or nests lists
    and mappings deeper than `max_depth`: YamlLimitError; or in which an alias contains itself:
    ComposerError. Aliases share nodes, so each node is sized once, bottom up: the work is that
    of the text, however large its expansion."""
    if root is None:
        return
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (characters, depth)
    open_nodes: set[int] = set()  # nodes whose children are being sized: ancestors of the top
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            children = [sizes[id(child)] for child in _node_children(node)]
            size = 2 + sum(chars for chars, _ in children)
            depth = 1 + max((d for _, d in children), default=0)
            open_nodes.discard(key)
        elif key in sizes:
            continue
        elif key in open_nodes:
            raise yaml.composer.ComposerError(problem="an alias refers to a value that contains it (a value "
                                                      "cannot contain itself)", problem_mark=node.start_mark)
        elif isinstance(node, yaml.ScalarNode):
            size, depth = len(node.value) + 1, 0
        else:
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in _node_children(node))
            continue
        sizes[key] = (size, depth)
        if size > limit:
            raise YamlLimitError(
                f"with its aliases written out, this value would have more than {limit:,} characters "
                "(the most a YAML input may have); write it without nested aliases", node.start_mark)
        if depth > max_depth:
            raise YamlLimitError(f"lists and mappings nested more than {max_depth} levels deep",
                                 node.start_mark, kind="YAML too deep")


class _StrictLoader(BoundedLoader):
    """BoundedLoader that refuses a key given twice in one mapping (YAML would keep the last silently)."""


def _strict_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, yaml.Mark] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:
            continue  # unhashable key: the constructor below reports it
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {short_repr(key)} (first given at line {first.line + 1})",
                key_node.start_mark)
        seen[key] = key_node.start_mark
    return loader.construct_mapping(node, deep=deep)


# Bits of the largest whole number Python will print in decimal (0 digits means no limit).
_MAX_INT_BITS = int((sys.get_int_max_str_digits() or 10**6) * math.log2(10)) - 4


def _checked_scalar(construct: Any, what: str) -> Any:
    """A SafeConstructor scalar method whose ValueError (a date such as 2024-13-45, a decimal
    number past the digits Python reads) is a YAML error at the value's line."""

    def constructor(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
        too_long = f"a whole number past the {sys.get_int_max_str_digits():,} decimal digits Python reads"
        try:
            value = construct(loader, node)
        except (ValueError, OverflowError) as exc:
            if what == "a whole number":  # the resolver matched its syntax: only its length can fail
                problem = too_long
            else:
                problem = f"cannot read {short_repr(node.value, 40)} as {what} ({cut(str(exc), 80)})"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from None
        if isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
            # Hexadecimal and binary have no digit limit: such a number could be read but never
            # printed (messages, results files and sweep point ids would fail on it).
            raise yaml.constructor.ConstructorError(None, None, too_long, node.start_mark)
        return value

    return constructor


BoundedLoader.add_constructor("tag:yaml.org,2002:int", _checked_scalar(yaml.SafeLoader.construct_yaml_int,
                                                                         "a whole number"))
BoundedLoader.add_constructor("tag:yaml.org,2002:timestamp",
                              _checked_scalar(yaml.SafeLoader.construct_yaml_timestamp, "a date"))
_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _strict_mapping)


def load_yaml_text(text: str, *, max_chars: int = MAX_YAML_CHARS) -> Any:
    """`yaml.safe_load` within the limits of BoundedLoader; every refusal is a yaml.YAMLError.
    `max_chars` may be raised for files servesim wrote itself (resolved.yaml writes lists one
    item a line, longer than the flow style an input may have used)."""
    loader = BoundedLoader(text, max_chars=max_chars)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_yaml(text: str, *, source: str | None = None, where: str | None = None) -> Any:
    """YAML text as Python data; a syntax error or repeated key names line and column."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        place = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else None
        if where and place:
            place = f"{where}, {place}"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context = getattr(exc, "context", None)
        kind = exc.kind if isinstance(exc, YamlLimitError) else "invalid YAML"
        text_ = f"{kind}: {problem}" + (f" ({context})" if context else "")
        raise ConfigError(text_, source=source, where=place or where) from None
    except RecursionError:
        raise ConfigError("invalid YAML: nested too deeply", source=source, where=where) from None


def load_yaml_mapping(path: str | Path, *, what: str = "experiment file") -> dict[str, Any]:
    """A YAML file that must hold a mapping, or one ConfigError naming the file and the place."""
    path = Path(path)
    too_large = {"source": str(path), "expected": f"at most {MAX_YAML_CHARS:,} characters"}
    try:
        # Read up to the limit and one byte more (UTF-8 takes up to 4 bytes a character): a huge
        # file, or an endless one such as /dev/zero, is refused without reading it all.
        with path.open("rb") as stream:
            raw = stream.read(4 * MAX_YAML_CHARS + 1)
        if len(raw) > 4 * MAX_YAML_CHARS:
            raise ConfigError(f"{what} is too large", **too_large, found=_Shown(f"more than {len(raw) - 1:,} bytes"))
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} not found", source=str(path)) from None
    except IsADirectoryError:
        raise ConfigError(f"{what} is a folder", source=str(path), expected="a YAML file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} is not UTF-8 text (byte {exc.start})", source=str(path),
                          expected="a YAML file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what}: {exc.strerror}", source=str(path)) from None
    if len(text) > MAX_YAML_CHARS:
        raise ConfigError(f"{what} is too large", **too_large, found=_Shown(f"{len(text):,} characters"))
    data = parse_yaml(text, source=str(path))
    if not isinstance(data, dict):
        article = "an" if what[:1] in "aeiou" else "a"
        raise ConfigError(f"{article} {what} must be a mapping", source=str(path),
                          expected="key: value lines at the top level",
                          found=_Shown("an empty file") if data is None else _found(data))
    return data


def apply_override(data: dict[str, Any], item: str, *, source: str | None = None) -> None:
    """Apply one `--set key.path=value` (value read as YAML; list items by index, e.g. policies.0.x=1)."""
    if not isinstance(item, str) or "=" not in item:
        raise ConfigError("an override must look like key.path=value", source=source, where="--set", found=item)
    path, raw = item.split("=", 1)
    path = path.strip()
    value = parse_yaml(raw, source=source, where=f"--set {path}")
    set_path(data, path, value, source=source)


# Most parts a dotted key path may have (an experiment's deepest key has about 5).
MAX_PATH_PARTS = 32


def set_path(data: dict[str, Any], path: str, value: Any, *, source: str | None = None) -> None:
    """data[a][b][c] = value for path "a.b.c", creating mappings on the way; list items by index.

    A path through a value that is neither a mapping nor a list is a ConfigError naming it.
    """
    keys = path.split(".")
    if not path or any(not k.strip() for k in keys):
        raise ConfigError("an override needs a dotted key path before '='", source=source, where="--set",
                          expected="e.g. workload.num_requests=50", found=path)
    if len(keys) > MAX_PATH_PARTS:  # each missing part becomes a nested mapping
        raise ConfigError("key path too long", source=source, where="--set",
                          expected=f"at most {MAX_PATH_PARTS} dotted parts", found=path)
    node: Any = data
    for i, key in enumerate(keys[:-1]):
        here = ".".join(keys[: i + 1])
        if isinstance(node, list):
            node = node[_list_index(key, node, here, source)]
        else:
            if key not in node or node[key] is None:
                node[key] = {}
            node = node[key]
        if not isinstance(node, (dict, list)):
            raise ConfigError("cannot set a key inside a value that is not a mapping", source=source, where=here,
                              found=_found(node))
    last = keys[-1]
    if isinstance(node, list):
        node[_list_index(last, node, path, source)] = value
    else:
        node[last] = value


def _list_index(key: str, node: list, where: str, source: str | None) -> int:
    text = key.strip()
    if not text.lstrip("-").isdigit() or not -len(node) <= int(text) < len(node):
        raise ConfigError("list index out of range", source=source, where=where,
                          expected=f"an index from 0 to {len(node) - 1}", found=key)
    return int(text)


# --- plain dataclasses from YAML mappings (cost-model parameters) ------------------------------


def build_model_from_params(cls: type[T], params: dict, *, where: str, source: Any = None) -> T:
    """Build a plain dataclass from a YAML mapping, rejecting unknown keys and wrong types."""
    src = str(source) if source else None
    if not isinstance(params, dict):
        raise ConfigError("wrong type", source=src, where=where, expected="a mapping (key: value)",
                          found=_found(params))
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for key in params:
        if key not in names:
            raise _error("unknown key", source=src, where=f"{where}.{key}", expected=f"one of {names}",
                         found=str(key), choices=names)
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - a hint that does not resolve just goes unchecked
        hints = {}
    for key, value in params.items():
        expected = _check_value(hints.get(key), value)
        if expected is not None:
            raise ConfigError("wrong type" if "finite" not in expected else "not a finite number", source=src,
                              where=f"{where}.{key}", expected=expected, found=_found(value))
    try:
        return cls(**params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc), source=src, where=where) from None


def _check_value(hint: Any, value: Any) -> str | None:
    """None when `value` fits the type hint (plain types only), else what was expected."""
    if hint is None or hint is Any:
        return None
    args = typing.get_args(hint)
    if _is_union(hint):
        if value is None and type(None) in args:
            return None
        problems = [_check_value(a, value) for a in args if a is not type(None)]
        if any(p is None for p in problems):
            return None
        return " or ".join(dict.fromkeys(p for p in problems if p)) or None
    base = typing.get_origin(hint) or hint
    if base is bool:
        return None if isinstance(value, bool) else "true or false"
    if base is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "a whole number"
    if base is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "a number"
        if isinstance(value, int):  # whole numbers past the float range have no float value
            return None if abs(value) <= sys.float_info.max else "a finite number"
        return None if math.isfinite(value) else "a finite number"
    if base is str:
        return None if isinstance(value, str) else "a string"
    if base is dict:
        return None if isinstance(value, dict) else "a mapping (key: value)"
    if base in (list, tuple):
        return None if isinstance(value, (list, tuple)) else "a list"
    return None
