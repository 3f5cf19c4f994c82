"""The project's own error types.

`ServesimError` is a user error: the CLI prints its message and exits with code 2, no traceback.
Anything else that escapes is an internal error and keeps its traceback.
"""

from __future__ import annotations

import difflib
import math
import reprlib
from collections.abc import Iterable

# Longest a value shown in an error message may be: enough to recognise it, never the whole of
# a large input (a long string, a list of a million items, an alias-expanded YAML structure).
MAX_SHOWN_CHARS = 100
# Whole numbers longer than this are described ("a whole number of about N digits") rather than
# printed: Python refuses to print ints past 4,300 digits, and printing is quadratic before that.
MAX_SHOWN_DIGITS = 60
# Words too long to be a misspelling of any choice get no "did you mean" hint (difflib is slow on them).
MAX_HINT_WORD = 200
# Longest a message's place (file, key path) and its other parts may be: a safety net for text
# built from the input (a key of a million characters), far above what any real message needs.
MAX_PART_CHARS = 1000


class ServesimError(Exception):
    """A problem with what the user asked for (input files, flags, impossible settings)."""


class ConfigError(ServesimError):
    """Bad input: names where (file, field or row), what was expected and what was found."""

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        where: str | None = None,
        expected: str | None = None,
        found: object = None,
        choices: Iterable[str] | None = None,
    ) -> None:
        parts = []
        if source:
            parts.append(cut(str(source)))
        if where:
            parts.append(cut(str(where)))
        head = ": ".join(parts)
        text = f"{head}: {cut(message)}" if head else cut(message)
        if expected is not None:
            text += f"; expected {cut(str(expected))}"
        if found is not None:
            text += f", found {short_repr(found)}"
        hint = close_match(found, choices) if choices is not None and isinstance(found, str) else None
        if hint:
            text += f" (did you mean {hint!r}?)"
        super().__init__(text)
        self.source = source
        self.where = where


def cut(text: str, limit: int = MAX_PART_CHARS) -> str:
    """`text` cut to `limit` characters, with '...' where it was cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def close_match(word: str, choices: Iterable[str]) -> str | None:
    """The choice a misspelt `word` most likely meant, for 'did you mean' hints: the same letters
    in another case or with dashes for underscores, then the choice starting with it (h100 ->
    h100-sxm; of several, difflib's closest of those), then difflib's closest of all."""
    options = [str(c) for c in choices]
    if not isinstance(word, str) or not word or len(word) > MAX_HINT_WORD or word in options:
        return None

    def norm(text: str) -> str:
        return text.casefold().replace("-", "_").replace(" ", "_")

    same = [c for c in options if norm(c) == norm(word)]
    if same:
        return same[0]
    starts = [c for c in options if norm(c).startswith(norm(word))]
    if starts:  # a family's name: one of its members, not a closer-spelt stranger (h100: not h200)
        folded = {norm(c): c for c in starts}
        return folded[difflib.get_close_matches(norm(word), list(folded), n=1, cutoff=0.0)[0]]
    folded = {norm(c): c for c in options}
    hints = difflib.get_close_matches(norm(word), list(folded), n=1, cutoff=0.6)
    return folded[hints[0]] if hints else None


class _ShortRepr(reprlib.Repr):
    """reprlib's size-limited repr: a few items per container, a few levels deep, and a cut for
    long strings and numbers; its work is bounded too, whatever the value's logical size (a
    structure repeating one list a billion times takes as long as a short one)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxtuple = self.maxlist = self.maxarray = self.maxdict = 6
        self.maxset = self.maxfrozenset = self.maxdeque = 6
        self.maxstring = self.maxother = MAX_SHOWN_CHARS
        self.maxlong = MAX_SHOWN_DIGITS

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > MAX_SHOWN_DIGITS * 3.33:  # about MAX_SHOWN_DIGITS decimal digits
            sign = "negative " if x < 0 else ""
            if x.bit_length() < 14_000:  # str() counts them (it refuses past 4,300 digits)
                return f"<a {sign}whole number of {len(str(abs(x))):,} digits>"
            return f"<a {sign}whole number of about {int(math.log10(abs(x))) + 1:,} digits>"
        return super().repr_int(x, level)


_SHORT_REPR = _ShortRepr()


def short_repr(value: object, limit: int = MAX_SHOWN_CHARS) -> str:
    """repr(value) cut to about `limit` characters, safe for any size of value (for messages)."""
    try:
        text = _SHORT_REPR.repr(value)
    except Exception:  # noqa: BLE001 - a value whose own __repr__ fails is still named
        text = f"<{type(value).__name__}>"
    return cut(text, limit)
