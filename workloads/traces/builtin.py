"""Where a trace path points: `builtin:<name>` for traces shipped in workloads/data, else a path
relative to the experiment file's folder (or absolute)."""

from __future__ import annotations

from pathlib import Path

from simcore.errors import ConfigError
from simcore.paths import expand_home

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
BUILTIN_TRACES = {
    # First 10,000 requests of the Azure 2023 conversation trace (see workloads/data/README.md).
    "azure_conv_2023": DATA_DIR / "azure_conv_2023_lengths.csv",
}


def resolve_trace_path(path: str, *, base_dir: Path, source: str | None = None) -> Path:
    """The file `path` names; a missing file is an error naming the option and what was tried."""
    if path.startswith("builtin:"):
        name = path.removeprefix("builtin:")
        if name not in BUILTIN_TRACES:
            raise ConfigError(
                "unknown builtin trace", source=source, where="workload.trace.path",
                expected=f"one of {['builtin:' + k for k in BUILTIN_TRACES]}", found=name, choices=list(BUILTIN_TRACES),
            )
        return BUILTIN_TRACES[name]
    try:
        resolved = (Path(base_dir) / expand_home(path)).resolve()
        is_file = resolved.is_file()
    except (OSError, ValueError) as exc:
        # A NUL byte or a lone surrogate (ValueError), a name past the file system's limit (OSError).
        from workloads.traces.common import shown

        raise ConfigError(f"not a usable path ({shown(str(exc))})", source=source, where="workload.trace.path",
                          found=shown(path)) from None
    if not is_file:
        raise ConfigError(
            "trace file not found", source=source, where="workload.trace.path",
            expected=f"a file (relative paths start at {base_dir})", found=str(resolved),
        )
    return resolved
