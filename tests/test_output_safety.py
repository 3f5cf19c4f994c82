"""Output folders: names that become paths, the folder lock, leftovers of killed runs, Ray on loopback.

The property tests draw policy labels and experiment names, dangerous ones included (`..`,
absolute paths, `/`, `\\`, NUL and other control characters, very long strings, unicode):
parsing either rejects them with a ConfigError that names the field and shows a bounded part of
the value, or accepts a name that is one safe path component; a few accepted ones are run
through `servesim run` and `servesim export` and must write nothing outside --out.
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
import string
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from experiments import sweep_exec
from experiments.cli import main
from experiments.config import parse_experiment
from experiments.io import LOCK_FILE, NAME_MAX_LENGTH, SCRATCH_DIR, locked_folder, path_under, remove_leftovers
from experiments.sweep import expand, load_sweep
from experiments.sweep_store import SweepStore
from simcore.errors import ConfigError, ServesimError
from tests.helpers import SMALL_EXPERIMENT

SETTINGS = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck), derandomize=True)
PARSE_EXAMPLES = 2000
RUN_EXAMPLES = 16

DANGEROUS = [
    "", ".", "..", "../x", "../../x", "a/../../b", "/", "/tmp/x", "/etc/passwd", "a/b", "a\\b", "..\\x", "C:\\x",
    "~", "~/x", "-rf", ".hidden", "a\x00b", "\x00", "a\nb", "a\tb", "\x1b[31m", "a\x7fb", " ", " a", "a ",
    "x" * (NAME_MAX_LENGTH + 1), "x" * 10_000, "é", "名前", "a\u202eb", "\ud800", "CON", "a:b", "a*b", "a?b",
    "a|b", "a\"b", "a<b>", "$HOME", "a;b", "%2e%2e", "a" * NAME_MAX_LENGTH, "continuous", "x.y", "_a", "+=", "a-b",
]
VALID_NAMES = st.from_regex(r"[A-Za-z0-9_+=][A-Za-z0-9._+=-]{0,12}", fullmatch=True)
# Names that pass the rule, near-misses of it, and the dangerous ones.
NAMES = st.one_of(
    st.sampled_from(DANGEROUS),
    VALID_NAMES,
    st.text(alphabet=string.printable + "é名\x00\x01\x1f\u2028/\\", max_size=12),
    st.text(max_size=30),
    st.builds(lambda a, b, c: a + b + c, st.sampled_from(["", ".", "..", "/", "-"]),
              st.text(alphabet=string.ascii_letters, max_size=5), st.sampled_from(["", "/", "/..", "\x00"])),
)


# For the runs, two accepted names in three (each a run), the rest drawn as above.
RUN_NAMES = st.integers(0, 2).flatmap(lambda k: NAMES if k == 0 else VALID_NAMES)


def with_name(field: str, value: str) -> dict:
    data = copy.deepcopy(SMALL_EXPERIMENT)
    if field == "label":
        data["policies"][0]["label"] = value
    else:
        data["name"] = value
    return data


def is_one_safe_component(value: str) -> bool:
    """What a folder name must be, checked without the project's own rule."""
    return (0 < len(value) <= NAME_MAX_LENGTH and value not in (".", "..") and not value.startswith((".", "-"))
            and all(c not in value for c in "/\\\x00") and value.isprintable() and value.isascii()
            and Path(value).name == value and not Path(value).is_absolute())


def assert_clear_rejection(error: ConfigError, field: str) -> None:
    text = str(error)
    assert ("policies[0].label" if field == "label" else "name:") in text, text
    assert "cannot be a file name" in text and "expected 1-100 characters" in text, text
    # The value is shown cut to a bounded length, and control characters never reach the terminal.
    assert len(text) < 600, len(text)
    assert text.isprintable(), repr(text)


@settings(max_examples=PARSE_EXAMPLES, **SETTINGS)
@given(field=st.sampled_from(["label", "name"]), value=NAMES)
def test_names_are_rejected_clearly_or_are_one_safe_component(field: str, value: str):
    try:
        exp = parse_experiment(with_name(field, value), source="exp.yaml")
    except ConfigError as error:
        assert_clear_rejection(error, field)
        return
    accepted = exp.policies[0].label if field == "label" else exp.name
    assert accepted == value and is_one_safe_component(value), repr(value)


def listing(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


@settings(max_examples=RUN_EXAMPLES, **SETTINGS)
@given(field=st.sampled_from(["label", "name"]), value=RUN_NAMES)
def test_accepted_names_write_only_inside_out(field: str, value: str):
    """A label is run with --out; a name without, so it makes the default folder results/<name>."""
    assume(not any(0xD800 <= ord(c) <= 0xDFFF for c in value))  # no file can hold a lone surrogate
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "exp.yaml").write_text(yaml.safe_dump(with_name(field, value)))
        work = root / "work"
        work.mkdir()
        out = work / "out" if field == "label" else work / "results" / value
        before = listing(root)
        cwd = os.getcwd()
        os.chdir(work)
        try:
            code = main(["run", str(root / "exp.yaml"), "--quiet", *(["--out", str(out)] if field == "label" else [])])
            event("ran" if code == 0 else "rejected")
            if code == 0:
                assert main(["export", str(out), "--vllm"]) == 0
        finally:
            os.chdir(cwd)
        written = listing(root) - before
        if code != 0:
            assert code == 2 and not written, written
            return
        inside = out.relative_to(root).as_posix()
        outside = {p for p in written if not (p == inside or p.startswith(inside + "/") or inside.startswith(p + "/"))}
        assert not outside, outside
        assert (out / "summary.json").is_file()
        if field == "label":
            assert (out / value / "requests.parquet").is_file() and (out / "vllm" / f"{value}.json").is_file()


def test_sweep_over_labels_checks_each_value(tmp_path: Path):
    data = dict(SMALL_EXPERIMENT, sweep={"policies.0.label": ["fine_1", "../escape"]})
    with pytest.raises(ConfigError, match=r"sweep key 'policies.0.label'.*cannot be a file name"):
        expand(data, source="exp.yaml")
    # Generated names pass: default labels numbered for repeats, point ids, the sweep folder.
    data = dict(SMALL_EXPERIMENT, policies=[{"name": "continuous"}] * 3, sweep={"seed": [0, 1]})
    plan = expand(data, source="exp.yaml")
    assert [p.point_id[:5] for p in plan.points] == ["0000-", "0001-"]
    assert main(["sweep", str(write_yaml(tmp_path, data)), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert sorted(p.name for p in (tmp_path / "out" / "points" / plan.points[0].point_id).iterdir()
                  if p.is_dir()) == ["continuous", "continuous-2", "continuous-3"]


def test_labels_differing_only_in_case_are_one_folder(tmp_path: Path):
    data = dict(SMALL_EXPERIMENT, policies=[{"name": "continuous", "label": "A"}, {"name": "static", "label": "a"}])
    with pytest.raises(ConfigError, match="unique"):
        parse_experiment(data, source="exp.yaml")


def test_path_under_refuses_every_way_out(tmp_path: Path):
    root = tmp_path / "out"
    root.mkdir()
    assert path_under(root, "a", "b.json") == root / "a" / "b.json"
    (root / "link").symlink_to(tmp_path)
    for parts in (["..", "x"], ["/etc/passwd"], ["a", "..", "..", "x"], ["link", "x"], ["a\x00b"]):
        with pytest.raises(ServesimError):
            path_under(root, *parts)


def test_export_of_a_hand_edited_label_stays_inside(tmp_path: Path, capsys):
    source = write_yaml(tmp_path, SMALL_EXPERIMENT)
    out = tmp_path / "deep" / "out"
    assert main(["run", str(source), "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    summary[0]["label"] = "../../escaped"  # as an edited (or pre-validation) folder may hold
    (out / "summary.json").write_text(json.dumps(summary))
    os.rename(out / "continuous", tmp_path / "escaped")  # where the reader now looks for the tables
    before = listing(tmp_path)
    capsys.readouterr()
    assert main(["export", str(out), "--vllm"]) == 2
    assert "not inside the output folder" in capsys.readouterr().err
    assert {p for p in listing(tmp_path) - before if not p.startswith("deep/out/vllm")} == set()


def write_yaml(folder: Path, data: dict) -> Path:
    path = folder / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# --- the folder lock and leftovers ------------------------------------------------------------


def hold_lock(folder: Path, pid: int) -> int:
    """Lock `folder` as another servesim process would (a separate open file: flock conflicts)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, f"{pid}\n".encode())
    return fd


@pytest.mark.parametrize("command", ["run", "sweep", "capacity"])
def test_a_folder_in_use_fails_at_once(tmp_path: Path, capsys, command: str):
    data = dict(SMALL_EXPERIMENT, sweep={"seed": [0, 1]})
    source = write_yaml(tmp_path, data)
    out = tmp_path / "out"
    fd = hold_lock(out, 424242)
    try:
        extra = ["--slo", "ttft_p90_ms=500", "--quiet"] if command == "capacity" else ["--quiet"]
        assert main([command, str(source), "--out", str(out), *extra]) == 2
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert f"{out} is in use by another servesim process (pid 424242)" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing written


def test_lock_of_a_dead_process_does_not_block_and_leftovers_go(tmp_path: Path, monkeypatch):
    out = tmp_path / "out"
    source = write_yaml(tmp_path, dict(SMALL_EXPERIMENT, sweep={"seed": [0, 1]}))
    SweepStore(out).write_manifest(load_sweep(source))  # as the killed sweep of this plan wrote it
    (out / SCRATCH_DIR / "servesim-point-abc123").mkdir(parents=True)
    (out / SCRATCH_DIR / "servesim-point-abc123" / "requests.parquet").write_bytes(b"half")
    (out / LOCK_FILE).write_text("999999\n")  # left by a kill -9: present, but not locked
    (out / "points" / "p" / "continuous").mkdir(parents=True)
    stale = [out / ".sweep.parquet.k3j_x9q2.tmp", out / "points" / "p" / "continuous" / ".steps.parquet.partial",
             out / "points" / "p" / "continuous" / ".steps.parquet.partial.part2"]
    for path in stale:
        path.write_bytes(b"half")
    kept = out / ".notes.tmp"  # not a name servesim writes: the user's
    kept.write_text("mine")
    scratch_used = []
    real_tempdir = sweep_exec.tempfile.TemporaryDirectory

    def recording_tempdir(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if kwargs.get("prefix") == "servesim-point-":
            scratch_used.append(kwargs.get("dir"))
        return real_tempdir(*args, **kwargs)

    monkeypatch.setattr(sweep_exec.tempfile, "TemporaryDirectory", recording_tempdir)
    assert main(["sweep", str(source), "--out", str(out), "--quiet"]) == 0
    assert scratch_used == [str((out / SCRATCH_DIR).resolve())] * 2  # points' temporary folders: in --out
    assert not any(path.exists() for path in stale)
    assert kept.read_text() == "mine"
    assert not (out / SCRATCH_DIR).exists() and not (out / LOCK_FILE).exists()


def test_nested_holds_in_one_process_and_leftover_cleaning(tmp_path: Path):
    with locked_folder(tmp_path / "out") as out:
        with locked_folder(out):  # a command holding its folder may call code that holds it too
            (out / ".x.abcdefgh.tmp").write_text("")
        assert (out / LOCK_FILE).is_file()
        remove_leftovers(out)
        assert not (out / ".x.abcdefgh.tmp").exists()
    assert not (out / LOCK_FILE).exists()


def test_unusable_out_is_a_config_error(tmp_path: Path, capsys):
    (tmp_path / "file").write_text("")
    source = write_yaml(tmp_path, dict(SMALL_EXPERIMENT, sweep={"seed": [0]}))
    assert main(["sweep", str(source), "--out", str(tmp_path / "file" / "out"), "--quiet"]) == 2
    assert "--out: cannot create the output folder" in capsys.readouterr().err


# --- Ray ----------------------------------------------------------------------------------------


def test_private_ray_starts_with_loopback_only(monkeypatch):
    """The switch is off while ray.init starts a private instance, and only then; a cluster
    address is joined as given. (tests/test_sweep_ray.py checks a real instance's sockets.)"""
    ray = pytest.importorskip("ray")
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append((kw, ray_constants.ENABLE_RAY_CLUSTER)))
    sweep_exec.RayExecutor(2, None)
    sweep_exec.RayExecutor(2, "ray://head:10001")
    (private, switch_private), (cluster, switch_cluster) = calls
    assert switch_private is False and private["include_dashboard"] is False
    assert private["_node_ip_address"] == "127.0.0.1"
    assert switch_cluster == before and cluster["address"] == "ray://head:10001"
    assert ray_constants.ENABLE_RAY_CLUSTER == before


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def listening_addresses(pids: set[int]) -> list[str]:
    """The local addresses of the TCP sockets in LISTEN state that these processes hold."""
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    addresses = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                addresses.append(_ip(fields[1].split(":")[0]))
    return addresses


def _ip(hex_address: str) -> str:
    import ipaddress

    raw = bytes.fromhex(hex_address)
    # /proc prints each 32-bit word in host (little-endian) order.
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(raw)
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped) if mapped is not None else str(address)
