"""Output folders and files: names, paths, locking and atomic writes.

- Atomic result files: write to a temporary name in the same folder, then rename, so a reader
  sees either the old file or the whole new one, never a partial file.
- Names that become file or folder names (policy labels, experiment names) follow one rule
  (NAME_RULE, checked by `name_error`), and every output path is built by `path_under`, which refuses a path that
  would land outside its output folder.
- `locked_folder` holds an output folder for one servesim process at a time and clears what a
  killed run left behind (scratch folders, temporary files of atomic writes).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simcore.errors import ConfigError, ServesimError

if TYPE_CHECKING:
    import pandas as pd

# Policy labels and experiment names become folder and file names (results/<name>/<label>/...),
# so they are held to a portable file-name rule rather than escaped: what a user types is what
# the folder is called.
NAME_MAX_LENGTH = 100
NAME_RULE = (f"1-{NAME_MAX_LENGTH} characters from ASCII letters, digits and . _ - + =, "
             "not starting with . or -")
_NAME_RE = re.compile(r"[A-Za-z0-9_+=][A-Za-z0-9._+=-]*")
# How much of a rejected value an error message repeats (a megabyte-long label is not echoed).
SHOWN_CHARS = 80


def name_problem(value: str) -> str | None:
    """Why `value` cannot be a file-name component under NAME_RULE, or None when it can."""
    if not value:
        return "is empty"
    if len(value) > NAME_MAX_LENGTH:
        return f"is {len(value):,} characters long"
    if value[0] in ".-":
        return f"starts with {value[0]}"
    if not _NAME_RE.fullmatch(value):
        bad = sorted({c for c in value if not re.fullmatch(r"[A-Za-z0-9._+=-]", c)})
        return "contains " + ", ".join(shown(c) for c in bad[:5]) + (" ..." if len(bad) > 5 else "")
    return None


def name_error(value: str) -> str | None:
    """The message for a value that breaks NAME_RULE (without the field), or None when it is fine."""
    problem = name_problem(value)
    if problem is None:
        return None
    return f"{shown(value)} cannot be a file name: it {problem}; expected {NAME_RULE}"


def shown(value: str, limit: int = SHOWN_CHARS) -> str:
    """`value` quoted for a message, cut to `limit` characters, with every character that is not
    printable escaped (control characters, bidi overrides, lone surrogates, which would not even
    encode for the terminal). Double quotes, because the config error formatter reads
    single-quoted words in a message as choices for its did-you-mean hint."""
    text = '"' + "".join(map(_printable, value[:limit])) + '"'
    return text + (f" (cut; {len(value):,} characters)" if len(value) > limit else "")


def _printable(char: str) -> str:
    if char in '"\\':
        return "\\" + char
    if char.isprintable():
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def path_under(root: Path | str, *parts: str | Path) -> Path:
    """`root / parts...`, refused unless it lies inside `root` once `..` and symbolic links are resolved.

    Every writer builds its output paths with this, so no name read from a file (a label, a point
    id) can send a file outside the output folder, whatever the checks before it let through."""
    root = Path(root)
    path = root.joinpath(*parts)
    base = root.resolve()
    try:
        target = path.resolve()
    except (OSError, ValueError) as exc:  # NUL bytes, symlink loops
        raise ServesimError(f"cannot write {_shown_path(path)}: {exc}") from None
    if target != base and base not in target.parents:
        raise ServesimError(f"refusing to write {_shown_path(path)}: it is not inside the output folder {root}")
    return path


def _shown_path(path: Path) -> str:
    return shown(str(path), 2 * SHOWN_CHARS)


# Held (flock) by the servesim process writing into the folder, and removed when it is done.
LOCK_FILE = ".servesim.lock"
# Workers' private folders for the points in flight (sweep_exec.compute_point), inside the output
# folder so a killed run's are found and removed by the next run into the same folder.
SCRATCH_DIR = ".tmp"
# Names of what an interrupted write leaves: atomic_write_bytes' temporary files
# (.NAME.XXXXXXXX.tmp, from mkstemp) and the step log's spill files (.steps.parquet.partial...).
_LEFTOVER_RE = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp|\..+\.partial(\.part\d+|\.merged)?")
# Deepest folder below an output folder that servesim writes files into (DIR/points/<id>/<label>).
_LEFTOVER_DEPTH = 3
# Folders this process holds, with how many nested `locked_folder` blocks hold each.
_held: dict[Path, int] = {}


def scratch_dir(folder: Path) -> Path:
    return Path(folder) / SCRATCH_DIR


@contextmanager
def locked_folder(folder: Path, *, where: str = "--out") -> Iterator[Path]:
    """Create `folder` and hold it for this process until the block ends; a second servesim
    process writing into it fails at once with a ServesimError naming the holder's pid.

    On entry it removes what a killed run left there (its scratch folder and temporary files);
    on exit it removes the lock file and the (then empty) scratch folder. The lock is an flock,
    so the kernel releases it when the process dies, even by kill -9. Nested blocks on the same
    folder in one process are allowed (a command holding its folder calls code that holds it too)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        key = folder.resolve()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot create the output folder ({_reason(exc)})", where=where,
                          found=str(folder)) from None
    if key in _held:
        _held[key] += 1
        try:
            yield folder
        finally:
            _held[key] -= 1
        return
    fd = _lock(folder, where)
    _held[key] = 1
    try:
        remove_leftovers(folder)
        yield folder
    finally:
        del _held[key]
        shutil.rmtree(scratch_dir(folder), ignore_errors=True)
        # Unlinked while still locked: a process that opened the old file meanwhile sees it is
        # gone once it gets the lock, and locks a fresh one (see _lock).
        (folder / LOCK_FILE).unlink(missing_ok=True)
        os.close(fd)


def _lock(folder: Path, where: str) -> int:
    path = folder / LOCK_FILE
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as exc:
            raise ConfigError(f"cannot lock the output folder ({_reason(exc)})", where=where,
                              found=str(folder)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(f"cannot lock the output folder ({_reason(exc)})", where=where,
                                  found=str(folder)) from None
            raise ServesimError(f"{folder} is in use by another servesim process (pid {holder or 'unknown'}); "
                                "wait for it to finish, or write somewhere else") from None
        # The holder we waited out may have removed the file between our open and our lock.
        try:
            current = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            current = None
        mine = os.fstat(fd)
        if current is not None and (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)


# --- replacing a whole folder ---------------------------------------------------------------------
#
# `run` (and `export`, a changed `sweep` plan with --overwrite, `capacity`) never write into the
# folder a reader may be reading: they build the new folder beside it, in `.<name>.partial`, and
# swap it into place when complete (`replace_folder`), so the folder's name holds the previous
# complete results or the new complete ones, never a mix. The staging folder sits in the same
# parent (a rename cannot cross file systems) and is used only while the target's lock is held.

# Version of the results-folder layout, written in run_info.json, sweep.json and capacity.json:
# readers refuse a folder of another version rather than misread it. 2: folders replaced whole.
FORMAT_VERSION = 2
# What marks a folder as servesim's results (any one of them): only such a folder is replaced.
RESULT_MARKERS = ("summary.json", "sweep.json", "capacity.json", "run_info.json", "resolved.yaml", "points")
_STAGING, _SWAPPED, _OLD = "partial", "swapped", "old"
# renameat2(2) flag that swaps two paths in one step (Linux 3.15+, on ext4, xfs, btrfs, tmpfs...).
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def staging_folder(target: Path) -> Path:
    """Where the replacement of `target` is built: `.<name>.partial` beside it."""
    return _sibling(target, _STAGING)


def _sibling(target: Path, kind: str) -> Path:
    # Resolved: `--out .` has no name of its own, and a symbolic link's folder is what is replaced.
    target = Path(target).resolve()
    if not target.name:
        raise ConfigError("cannot replace the root folder", where="--out", found=str(target))
    return target.parent / f".{target.name}.{kind}"


def is_empty_folder(folder: Path) -> bool:
    """Absent, or holding nothing but servesim's own lock and scratch folder."""
    try:
        return all(p.name in (LOCK_FILE, SCRATCH_DIR) for p in Path(folder).iterdir())
    except FileNotFoundError:
        return True


def is_results_folder(folder: Path) -> bool:
    """A folder servesim wrote (run, sweep or capacity; complete or not)."""
    folder = Path(folder)
    if any((folder / name).exists() for name in RESULT_MARKERS):
        return True
    try:
        return any((p / "summary.json").is_file() for p in folder.iterdir() if p.is_dir())
    except OSError:
        return False


def check_replaceable(target: Path, *, overwrite: bool, what: str = "results", where: str = "--out") -> None:
    """Refuse to write over a non-empty `target` unless `overwrite` is set and it is servesim's
    own results folder (never a folder of the user's that --out happened to name)."""
    if is_empty_folder(target):
        return
    if not is_results_folder(target):
        raise ConfigError(f"the folder is not empty and is not a servesim results folder; refusing to replace it "
                          f"(give a new or empty folder for the {what})", where=where, found=str(target))
    if not overwrite:
        raise ConfigError(f"the folder already holds results; pass --overwrite to replace it whole, or give "
                          f"another --out for the {what}", where=where, found=str(target))


def fresh_staging(target: Path) -> Path:
    """An empty staging folder for `target` (call while holding `target`'s lock): what a killed
    run left there, or a swap did not finish removing, goes first."""
    staged = staging_folder(target)
    shutil.rmtree(staged, ignore_errors=True)
    return resumed_staging(target)


def resumed_staging(target: Path) -> Path:
    """The staging folder for `target`, kept with what an interrupted run built there (a
    resumable command goes on from it) but without its temporary files or a swap's leftovers."""
    remove_swap_leftovers(target)
    staged = staging_folder(target)
    staged.mkdir(exist_ok=True)
    remove_leftovers(staged)
    return staged


def remove_swap_leftovers(target: Path) -> None:
    """The old folder a killed `replace_folder` had not finished deleting."""
    for kind in (_SWAPPED, _OLD):
        shutil.rmtree(_sibling(target, kind), ignore_errors=True)


def remove_staging(target: Path) -> None:
    """The staging folder of `target` and any swap leftovers (a run that failed and keeps nothing)."""
    shutil.rmtree(staging_folder(target), ignore_errors=True)
    remove_swap_leftovers(target)


def replace_folder(staged: Path, target: Path) -> None:
    """Put the complete folder `staged` in `target`'s place in one rename, then delete the old one.

    Call while holding `target` (locked_folder): its lock file is linked into the new folder
    first, so a second process still finds the folder held until this one lets go. Where the
    kernel or file system cannot swap two folders in one step, two renames do it, and a kill
    between them leaves no folder at `target` (the next run removes both hidden leftovers)."""
    staged, target = Path(staged), Path(target).resolve()
    lock = target / LOCK_FILE
    if lock.exists() and not (staged / LOCK_FILE).exists():
        os.link(lock, staged / LOCK_FILE)
    # Renamed first, so a kill at any moment after this leaves no `.partial` folder that a
    # resumable command could take for its own work: `.swapped` is always removed.
    swapped = _sibling(target, _SWAPPED)
    shutil.rmtree(swapped, ignore_errors=True)
    os.rename(staged, swapped)
    if not _exchange(swapped, target):
        old = _sibling(target, _OLD)
        shutil.rmtree(old, ignore_errors=True)
        os.rename(target, old)
        os.rename(swapped, target)
        swapped = old
    shutil.rmtree(swapped, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (renameat2 RENAME_EXCHANGE); False where that is not available."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _read_pid(fd: int) -> str | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return None
    return text if text.isdigit() else None


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc)


def remove_leftovers(folder: Path) -> None:
    """Delete what a killed run left in `folder`: its scratch folder and, anywhere below, the
    temporary files of interrupted atomic writes and step-log spills. Call only while holding
    the folder (locked_folder), so no live writer's file is taken."""
    shutil.rmtree(scratch_dir(folder), ignore_errors=True)
    top = len(Path(folder).parts)
    for parent, dirs, files in os.walk(folder):  # does not follow symbolic links
        # Only as deep as servesim writes (DIR/points/<id>/<label>/), and not into hidden folders:
        # --out may name a large folder of the user's own.
        depth = len(Path(parent).parts) - top
        dirs[:] = [] if depth >= _LEFTOVER_DEPTH else [d for d in dirs if not d.startswith(".")]
        for name in files:
            if _LEFTOVER_RE.fullmatch(name):
                Path(parent, name).unlink(missing_ok=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates 0600; give the file the permissions a plain open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_table(frame: pd.DataFrame, path: Path, fmt: str) -> Path:
    """Write a table as Parquet or CSV (suffix set from the format), atomically."""
    path = path.with_suffix(".parquet" if fmt == "parquet" else ".csv")
    if fmt == "parquet":
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(frame, preserve_index=False)
        # Dictionary pages only for non-numeric columns (text with few distinct values): on the
        # numeric ones they tripled the write time of a 10k-request table and grew the file.
        others = [f.name for f in table.schema if not (pa.types.is_integer(f.type) or pa.types.is_floating(f.type))]
        buffer = io.BytesIO()
        pq.write_table(table, buffer, use_dictionary=others)
        atomic_write_bytes(path, buffer.getvalue())
    else:
        atomic_write_text(path, frame.to_csv(index=False))
    return path


def read_table(path: Path) -> pd.DataFrame:
    import pandas as pd

    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    return pd.read_csv(path)
