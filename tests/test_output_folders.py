"""Reusing an output folder: --overwrite replaces it whole, a folder of the same sweep resumes,
a folder of the user's own is never replaced, and readers refuse a folder of another format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from experiments import io
from experiments.cli import main
from tests.helpers import SMALL_EXPERIMENT


def write_yaml(folder: Path, name: str, data: dict) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def listing(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def hidden_siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


def test_run_into_a_folder_with_results_needs_overwrite_and_replaces_it_whole(tmp_path: Path, capsys):
    out = tmp_path / "out"
    first = write_yaml(tmp_path, "first", SMALL_EXPERIMENT)
    assert main(["run", str(first), "--out", str(out), "--quiet"]) == 0
    assert main(["export", "--vllm", str(out)]) == 0
    before = listing(out)
    capsys.readouterr()

    second = write_yaml(tmp_path, "second", {**SMALL_EXPERIMENT, "seed": 7,
                                             "policies": [{"name": "continuous", "label": "other"}]})
    assert main(["run", str(second), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--out: the folder already holds results; pass --overwrite" in err and "Traceback" not in err
    assert listing(out) == before  # untouched

    assert main(["run", str(second), "--out", str(out), "--quiet", "--overwrite"]) == 0
    # Nothing of the first run survives: not its policy folder, not its export.
    assert not (out / "vllm").exists() and not (out / "continuous").exists()
    assert [row["label"] for row in json.loads((out / "summary.json").read_text())] == ["other"]
    assert hidden_siblings(out) == []


def test_overwrite_never_replaces_a_folder_of_the_users_own(tmp_path: Path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("months of work")
    source = write_yaml(tmp_path, "exp", SMALL_EXPERIMENT)
    assert main(["run", str(source), "--out", str(mine), "--overwrite", "--quiet"]) == 2
    assert "not a servesim results folder; refusing to replace it" in capsys.readouterr().err
    assert listing(mine) == ["thesis.tex"] and hidden_siblings(mine) == []
    # An export into it is refused too.
    out = tmp_path / "out"
    assert main(["run", str(source), "--out", str(out), "--quiet"]) == 0
    assert main(["export", "--vllm", str(out), "--out", str(mine)]) == 2
    assert "refusing to replace it" in capsys.readouterr().err
    assert listing(mine) == ["thesis.tex"]


def test_sweep_resumes_its_own_plan_and_another_plan_needs_overwrite(tmp_path: Path, capsys):
    out = tmp_path / "out"
    plan = write_yaml(tmp_path, "plan", {**SMALL_EXPERIMENT, "sweep": {"seed": [0, 1]}})
    assert main(["sweep", str(plan), "--out", str(out), "--quiet"]) == 0
    assert main(["sweep", str(plan), "--out", str(out), "--quiet"]) == 0  # same plan: resumed, nothing to run
    assert "2 points were already finished" in capsys.readouterr().err

    other = write_yaml(tmp_path, "other", {**SMALL_EXPERIMENT, "sweep": {"seed": [5]}})
    assert main(["sweep", str(other), "--out", str(out), "--quiet"]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert main(["sweep", str(other), "--out", str(out), "--quiet", "--overwrite"]) == 0
    assert len(list((out / "points").iterdir())) == 1  # the first plan's points went with it
    assert hidden_siblings(out) == []


def test_readers_refuse_a_folder_of_another_format(tmp_path: Path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(write_yaml(tmp_path, "exp", SMALL_EXPERIMENT)), "--out", str(out), "--quiet"]) == 0
    info = json.loads((out / "run_info.json").read_text())
    for version, says in ((None, "written by an older servesim"), (io.FORMAT_VERSION + 1, "by a newer servesim")):
        info.pop("format_version")
        if version is not None:
            info["format_version"] = version
        (out / "run_info.json").write_text(json.dumps(info))
        for command in (["report", str(out)], ["export", "--vllm", str(out)]):
            assert main(command) == 2
            err = capsys.readouterr().err
            assert "results folder of another format" in err and says in err, err
        info["format_version"] = io.FORMAT_VERSION


@pytest.mark.parametrize("exchange", [True, False])
def test_replace_folder_with_and_without_an_atomic_swap(tmp_path: Path, monkeypatch, exchange: bool):
    if not exchange:  # as on a kernel or file system without renameat2(RENAME_EXCHANGE)
        monkeypatch.setattr(io, "_exchange", lambda a, b: False)
    target = tmp_path / "target"
    with io.locked_folder(target):
        (target / "old.txt").write_text("old")
        staged = io.fresh_staging(target)
        (staged / "new.txt").write_text("new")
        io.replace_folder(staged, target)
        # The new folder is held by the same lock (linked in), until the block ends.
        assert sorted(p.name for p in target.iterdir()) == [io.LOCK_FILE, "new.txt"]
    assert listing(target) == ["new.txt"] and hidden_siblings(target) == []


def test_a_swap_cut_short_leaves_the_previous_folder_and_is_cleared_next_time(tmp_path: Path, monkeypatch):
    """Killed inside replace_folder, after the staged folder took its `.swapped` name: the
    target still holds the previous folder, and the next staging removes the leftover."""
    target = tmp_path / "target"

    def killed(a: Path, b: Path) -> bool:
        raise SystemExit("killed")

    monkeypatch.setattr(io, "_exchange", killed)
    with io.locked_folder(target):
        (target / "old.txt").write_text("old")
        staged = io.fresh_staging(target)
        (staged / "new.txt").write_text("new")
        with pytest.raises(SystemExit):
            io.replace_folder(staged, target)
    assert listing(target) == ["old.txt"] and hidden_siblings(target) == [".target.swapped"]
    with io.locked_folder(target):
        io.fresh_staging(target)
        assert hidden_siblings(target) == [".target.partial"]
