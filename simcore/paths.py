"""Paths a user writes in an experiment file or on the command line."""

from __future__ import annotations

import os
from pathlib import Path


def expand_home(text: str | Path) -> Path:
    """`text` as a path with a leading ~ or ~user expanded. Where that user does not exist it is
    left as written, so the caller's own not-found error names it (`Path.expanduser` raises a
    RuntimeError there instead)."""
    return Path(os.path.expanduser(text))


def path_beside(text: str | Path, source: str | Path | None) -> Path:
    """`text` as a path (see `expand_home`); a relative one is read from the folder of `source`,
    the file that names it (an experiment file), when there is one."""
    path = expand_home(text)
    if not path.is_absolute() and source is not None:
        path = Path(source).parent / path
    return path
