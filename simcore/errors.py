"""The project's own error types.

`ServesimError` is a user error: the CLI prints its message and exits with code 2, no traceback.
Anything else that escapes is an internal error and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


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
            parts.append(str(source))
        if where:
            parts.append(str(where))
        head = ": ".join(parts)
        text = f"{head}: {message}" if head else message
        if expected is not None:
            text += f"; expected {expected}"
        if found is not None:
            text += f", found {found!r}"
        hint = close_match(found, choices) if choices is not None and isinstance(found, str) else None
        if hint:
            text += f" (did you mean {hint!r}?)"
        super().__init__(text)
        self.source = source
        self.where = where


def close_match(word: str, choices: Iterable[str]) -> str | None:
    """The choice a misspelt `word` most likely meant, for 'did you mean' hints: the same letters
    in another case or with dashes for underscores, then a unique choice starting with it
    (h100 -> h100-sxm), then difflib's closest."""
    options = [str(c) for c in choices]
    if not isinstance(word, str) or not word or word in options:
        return None

    def norm(text: str) -> str:
        return text.casefold().replace("-", "_").replace(" ", "_")

    same = [c for c in options if norm(c) == norm(word)]
    if same:
        return same[0]
    starts = [c for c in options if norm(c).startswith(norm(word))]
    if len(starts) == 1:
        return starts[0]
    folded = {norm(c): c for c in options}
    hints = difflib.get_close_matches(norm(word), list(folded), n=1, cutoff=0.6)
    return folded[hints[0]] if hints else None
