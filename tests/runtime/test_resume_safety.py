"""A run loses nothing on a refused resume, a damaged checkpoint or a full disk (`asp train`, standalone runtime).

- Refused resume: the recorder opens metrics.jsonl only once the run is known to proceed, so a resume refused
  for a damaged state.json leaves every file of the run byte for byte; a damaged state.json is refused naming
  the file and the key (CLI and driver), never with a KeyError traceback.
- Run lock: a directory a live run holds (`run.lock`, flock) is refused at once for a second run, an
  `--overwrite` or a `--resume`, naming the directory and the holder's pid; the lock dies with its process
  (SIGKILL included, a forked child does not keep it).
- Integrity: state.json records the SHA-256 of trainer.pt, latest.json the one of state.json; a changed byte in
  either is refused naming the file; a checkpoint without hashes loads with a warning; NaN weights are refused
  naming trainer.pt.
- Full disk: ENOSPC (or torch's "unexpected pos") while a checkpoint is written ends with one line naming the
  checkpoint's path, the temporary directory gone and the previous checkpoint whole and resumable; ENOSPC or
  EIO while a step is appended to metrics.jsonl between checkpoints ends the same way (one RunError line naming
  the file, the cause and the checkpoint to resume from).
- Lengths: a history restored from a checkpoint obeys the length bounds of every file reader (1 .. 10^7
  tokens): a 0 is refused naming state.json and the key, not kept to fail `asp simulate` later.

All fast (no Ray, no vLLM) except the last test, which runs the whole story through `asp train`.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from mindspeed_asp.cli import main
from mindspeed_asp.errors import CheckpointError, InputError, OutputError, RunError
from mindspeed_asp.runtime import checkpoint as ck
from mindspeed_asp.runtime.run_recorder import RunRecorder, read_steps

STEP_LINES = "".join(json.dumps({"step": k, "version": k + 1, "t_end": float(k)}) + "\n" for k in range(4))


def _snapshot(root: Path) -> Dict[str, bytes]:
    """Every file under `root` (hidden ones too) with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and ": error: " in lines[0] and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def no_ray(monkeypatch):
    """Ray's entry points as tripwires: every refusal here must come before Ray starts."""
    from mindspeed_asp.runtime import ray_utils

    def tripwire(*args, **kwargs):
        raise AssertionError("reached Ray instead of being refused first")

    for name in ("start_local_ray", "connect_ray"):
        monkeypatch.setattr(ray_utils, name, tripwire)
    monkeypatch.setattr(ray_utils, "stop_local_ray", lambda *a, **k: None)


class FakeTrainer:
    """Writes a real torch archive (the format the trainer writes): 1000 float32 values of 1.5."""

    def save_checkpoint(self, path):
        torch = pytest.importorskip("torch")
        torch.save({"weights": torch.full((1000,), 1.5)}, path)
        return str(path)


def _config(tiny_model: str, *extra: str):
    from mindspeed_asp.runtime.run_config import load_run_config, packaged_config_path

    return load_run_config(packaged_config_path(), [f"model.path={tiny_model}", "asp.mode=async", "run.steps=4",
                                                    "run.plots=false", *extra])


def _full_state(cfg, scratch: Path) -> dict:
    """A complete state.json for an async run at version 2, from the components' own state_dicts."""
    from mindspeed_asp.core.policy import LagPolicy
    from mindspeed_asp.runtime.dispatcher import MODE_POLICY, Dispatcher
    from mindspeed_asp.runtime.run_config import dump_config
    from mindspeed_asp.runtime.sample_queue import SampleQueue

    lag = LagPolicy(cfg.asp.max_lag, cfg.asp.minibatch_groups)
    rec = RunRecorder(scratch, mode="async", instances=cfg.asp.instances, slots=cfg.asp.slots,
                      minibatch_groups=cfg.asp.minibatch_groups, max_lag=cfg.asp.max_lag)
    return {"version": 2, "mode": "async", "config": dump_config(cfg),
            "driver": {"next_gid": 0, "window_index": 0, "plan_iteration": 0, "steals_logged": 0,
                       "minibatch_tag": {}, "infos": [], "sync_rounds": [], "trained_gids": [], "peak_rss": 0.0,
                       "decode_steps": {}, "resumes": []},
            "policy": lag.state_dict(),
            "dispatcher": Dispatcher(MODE_POLICY["async"], cfg.asp.instances, lag=lag).state_dict(),
            "queue": SampleQueue(lag).state_dict(), "recorder": rec.state_dict(), "planner": None,
            "rng": ck.rng_state()}


def _run_with_steps(run: Path) -> Path:
    """A run directory whose metrics.jsonl holds 4 steps and rollout_log.jsonl a line (what a refusal must keep)."""
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text(STEP_LINES)
    (run / "rollout_log.jsonl").write_text('{"prompt_id": "p0", "epoch": 0, "response_lengths": [3, 4]}\n')
    return run


# ============================================================================ 1. a refused resume keeps the files
def test_a_recorder_writes_no_step_file_until_the_run_proceeds(tmp_path):
    """Built, and given a checkpoint's records with `defer_files`, the recorder leaves metrics.jsonl alone;
    `open_steps` then rewrites it to the checkpoint's steps and appends."""
    _run_with_steps(tmp_path)
    rec = RunRecorder(tmp_path, mode="asp", instances=1, slots=4, minibatch_groups=1, max_lag=1)
    assert (tmp_path / "metrics.jsonl").read_text() == STEP_LINES  # a recorder built for a resume leaves it as it is
    state = rec.state_dict()
    state["steps"] = [json.loads(line) for line in STEP_LINES.splitlines()[:2]]
    rec.load_state_dict(ck.decode(json.loads(json.dumps(ck.encode(state)))), defer_files=True)
    assert (tmp_path / "metrics.jsonl").read_text() == STEP_LINES
    rec.open_steps()
    assert [r["step"] for r in read_steps(tmp_path)] == [0, 1]
    rec.log_step({"step": 2, "version": 3, "t_end": 2.0}, [0])
    rec.close()
    assert [r["step"] for r in read_steps(tmp_path)] == [0, 1, 2]


@pytest.mark.parametrize("damage,key,words", [
    (lambda s: s["driver"].pop("next_gid"), "driver.next_gid", "missing"),
    (lambda s: s["recorder"].__setitem__("steps", "oops"), "recorder.steps", "must be a list"),
    (lambda s: s.pop("queue"), "queue", "missing"),
    (lambda s: s["dispatcher"].__setitem__("fifo", 7), "dispatcher", "cannot be restored"),
], ids=["missing-key", "wrong-type", "missing-section", "bad-inner-value"])
def test_a_damaged_state_is_refused_naming_the_key_and_the_run_files_stay(tmp_path, tiny_model, no_ray, damage, key,
                                                                          words):
    """The driver refuses a state.json with a missing key or a wrong type, naming the file and the key, before
    Ray, and every file of the run is byte for byte as it was (metrics.jsonl included)."""
    from mindspeed_asp.runtime.driver import Driver
    from mindspeed_asp.runtime.tasks import task_and_prompts

    cfg = _config(tiny_model)
    run = _run_with_steps(tmp_path / "run")
    task_and_prompts(cfg)[0].to_jsonl(run / "dataset.jsonl")  # what set-up writes (same bytes)
    state = _full_state(cfg, tmp_path / "scratch")
    damage(state)
    directory = ck.write_checkpoint(run, state, FakeTrainer())
    before = _snapshot(run)
    with pytest.raises(InputError) as exc:
        Driver(cfg, run, progress=False, manage_ray=False, resume=directory).run()
    assert str(directory / "state.json") in str(exc.value) and f"key '{key}'" in str(exc.value)
    assert words in str(exc.value)
    assert _snapshot(run) == before


def test_cli_resume_of_a_state_without_its_config_is_one_line(tmp_path, no_ray, capsys):
    """`asp train --resume` on a state.json without `config`: one line naming the file and the key (the old
    CLI died with a KeyError traceback), and the run's files untouched."""
    run = _run_with_steps(tmp_path / "run")
    ck.write_checkpoint(run, {"version": 2, "mode": "async"}, FakeTrainer())
    before = _snapshot(run)
    assert main(["train", "--quiet", "--resume", str(run)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "state.json" in line and "key 'config'" in line
    assert _snapshot(run) == before


# ============================================================================ 2. the run lock
HOLDER = """
import os, sys, time
from mindspeed_asp.utils.run_dir import lock_run_dir
lock = lock_run_dir(sys.argv[1])
child = os.fork()  # a forked child (as a worker would be) must not keep the lock after its parent dies
if child == 0:
    time.sleep(120)
    os._exit(0)
print(os.getpid(), child, flush=True)
time.sleep(120)
"""


@pytest.fixture
def held(tmp_path) -> Iterator[tuple]:
    """A run directory locked by another live process (which has forked a child); yields (dir, pid, child)."""
    run = _run_with_steps(tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    pid, child = (int(x) for x in proc.stdout.readline().split())
    try:
        yield run, pid, child
    finally:
        for p in (pid, child):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)


def test_a_locked_directory_is_refused_for_every_entry_naming_the_pid(held, tiny_model, no_ray, monkeypatch,
                                                                      capsys):
    """While another run holds the directory: `--out DIR`, `--out DIR --overwrite` and `--resume DIR` are
    refused at once with one line naming DIR and the pid, the driver refuses before its set-up, and nothing in
    the directory changes."""
    from mindspeed_asp.utils.run_dir import lock_run_dir, prepare_run_dir
    from mindspeed_asp.runtime.driver import Driver

    run, pid, _ = held
    ck.write_checkpoint(run, {"version": 2, "mode": "async"}, FakeTrainer())
    before = _snapshot(run)
    for argv in (["--out", str(run)], ["--out", str(run), "--overwrite"], ["--resume", str(run)]):
        assert main(["train", "--quiet", *argv]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert str(run) in line and f"pid {pid}" in line and "in use by another run" in line, line
    with pytest.raises(OutputError, match=f"pid {pid}"):
        prepare_run_dir(run, overwrite=True)
    with pytest.raises(OutputError, match=f"pid {pid}"):
        lock_run_dir(run)

    def setup_reached(self):
        raise AssertionError("the driver started its set-up in a directory another run holds")

    monkeypatch.setattr(Driver, "_setup", setup_reached)
    with pytest.raises(OutputError, match=f"pid {pid}"):
        Driver(_config(tiny_model), run, progress=False, manage_ray=False).run()
    assert _snapshot(run) == before


def test_the_lock_dies_with_its_process_not_with_its_forked_child(held):
    """SIGKILL to the holder: the directory can be locked at once (no stale lock to clear), although the
    child it forked still lives; a released lock leaves no run.lock behind."""
    from mindspeed_asp.utils.run_dir import LOCK_FILE, lock_run_dir

    run, pid, child = held
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 10
    while True:
        try:
            lock = lock_run_dir(run)
            break
        except OutputError:
            assert time.time() < deadline, "the lock outlived its process"
            time.sleep(0.1)
    os.kill(child, 0)  # the child is still alive: it did not keep the lock
    assert (run / LOCK_FILE).read_text().split()[0] == str(os.getpid())
    lock.release()
    assert not (run / LOCK_FILE).exists()
    ck.write_checkpoint(run, {"version": 2}, FakeTrainer())
    assert ck.latest_checkpoint(run).name.startswith("ckpt-000002")  # resumable again


# ============================================================================ 3. integrity
def _flip_values(path: Path) -> None:
    """Change trainer.pt's 1.5s into 2.5s in place: still a well-formed zip, finite, wrong."""
    data = path.read_bytes()
    old, new = struct.pack("<f", 1.5) * 8, struct.pack("<f", 2.5) * 8
    assert old in data
    path.write_bytes(data.replace(old, new, 1))


def test_a_changed_trainer_file_is_refused_naming_it(tmp_path, no_ray, capsys):
    """Bytes of trainer.pt changed (the zip still well-formed, torch.load happily returns the wrong values):
    refused by latest_checkpoint and by `asp train --resume` in one line naming the file and the hash."""
    torch = pytest.importorskip("torch")
    run = _run_with_steps(tmp_path / "run")
    directory = ck.write_checkpoint(run, {"version": 2, "mode": "async"}, FakeTrainer())
    _flip_values(directory / "trainer.pt")
    assert float(torch.load(directory / "trainer.pt")["weights"][0]) == 2.5  # torch.load checks nothing
    with pytest.raises(InputError, match="does not match the hash recorded in state.json") as exc:
        ck.latest_checkpoint(run)
    assert str(directory / "trainer.pt") in str(exc.value)
    before = _snapshot(run)
    assert main(["train", "--quiet", "--resume", str(run)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "trainer.pt" in line and "damaged or replaced" in line
    assert _snapshot(run) == before


def test_a_changed_state_file_is_refused_naming_it(tmp_path):
    run = tmp_path / "run"
    directory = ck.write_checkpoint(run, {"version": 2, "mode": "async", "note": "a"}, FakeTrainer())
    text = (directory / "state.json").read_text()
    (directory / "state.json").write_text(text.replace('"note": "a"', '"note": "b"'))
    with pytest.raises(InputError, match="state.json does not match the hash recorded in latest.json"):
        ck.latest_checkpoint(run)
    with pytest.raises(InputError, match="state.json does not match"):
        ck.load_state(directory)


@pytest.mark.parametrize("pointer", ["OTHER", "/abs/ckpt", "..", "."])
def test_a_pointer_out_of_the_run_is_refused(tmp_path, pointer):
    """latest.json naming another run's checkpoint (or any path) would resume someone else's state silently."""
    import json

    other = ck.write_checkpoint(tmp_path / "other_run", {"version": 2, "mode": "async"}, FakeTrainer())
    run = tmp_path / "run"
    ck.write_checkpoint(run, {"version": 1, "mode": "async"}, FakeTrainer())
    latest = run / "checkpoint" / "latest.json"
    data = json.loads(latest.read_text())
    # OTHER: a real, complete checkpoint of another run, which must be refused, not resumed
    data["dir"] = f"../../other_run/checkpoint/{other.name}" if pointer == "OTHER" else pointer
    latest.write_text(json.dumps(data))
    with pytest.raises(InputError, match="is not the name of a checkpoint directory of this run"):
        ck.latest_checkpoint(run)


def test_a_checkpoint_without_hashes_loads_with_a_warning(tmp_path, capsys):
    """A checkpoint without recorded hashes: found and loaded, with a warning naming what is not verified."""
    run = tmp_path / "run"
    full = _full_state(_config(str(tmp_path / "model")), tmp_path / "scratch")
    directory = ck.write_checkpoint(run, full, FakeTrainer())
    state = json.loads((directory / "state.json").read_text())
    del state[ck.HASHES_KEY]
    (directory / "state.json").write_text(json.dumps(state))
    latest = ck.checkpoint_root(run) / "latest.json"
    latest.write_text(json.dumps({k: v for k, v in json.loads(latest.read_text()).items() if k != ck.STATE_HASH_KEY}))
    assert ck.latest_checkpoint(run) == directory
    assert ck.verify_files(directory) == ["state.json", "trainer.pt"]
    assert capsys.readouterr().err == ""  # the CLI's checks stay quiet: the warning comes when the run loads it
    assert ck.load_state(directory)["version"] == 2
    err = capsys.readouterr().err
    assert "warning" in err and "records no hashes" in err and "trainer.pt" in err


@pytest.fixture(scope="module")
def trainer(tiny_model):
    from mindspeed_asp.runtime.trainer import GRPOTrainer

    return GRPOTrainer(tiny_model, seed=0)


def test_nan_weights_are_refused_naming_the_checkpoint_file(tmp_path, trainer, tiny_model):
    """A trainer.pt holding NaN: the driver's restore names trainer.pt and the tensor (not the engine), and the
    trainer keeps its own weights."""
    import torch

    from mindspeed_asp.runtime.driver import Driver

    path = tmp_path / "ckpt" / "trainer.pt"
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=True)
    name = next(iter(state["model"]))
    state["model"][name].view(-1)[:3] = float("nan")
    torch.save(state, path)
    before = trainer.weights_checksum()
    with pytest.raises(ValueError, match=f"model tensor {name} \\(3 of"):
        trainer.load_checkpoint(path)
    driver = Driver(_config(tiny_model), tmp_path / "run", progress=False, manage_ray=False, resume=path.parent)
    driver.trainer = trainer
    with pytest.raises(RunError) as exc:
        driver._resume_weights()
    assert f"checkpoint {path}:" in str(exc.value) and "NaN" in str(exc.value)
    assert trainer.weights_checksum() == before


# ============================================================================ 4. a full disk
class FullDiskTrainer:
    """Writes part of trainer.pt, then fails as a full disk does (`how`: the OSError, or torch's own error)."""

    def __init__(self, how: str) -> None:
        self.how = how

    def save_checkpoint(self, path):
        Path(path).write_bytes(b"\0" * 300_000)  # what reached the disk before it filled
        if self.how == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        import torch

        torch.save({"weights": torch.zeros(100_000)}, "/dev/full")  # a real ENOSPC, as torch reports it


def _check_previous_intact(run: Path, previous: Path) -> None:
    root = ck.checkpoint_root(run)
    assert sorted(p.name for p in root.iterdir()) == [previous.name, "latest.json"]  # no temporary directory
    assert ck.latest_checkpoint(run) == previous and ck.read_state(previous)["version"] == 2
    assert ck.verify_files(previous) == []


@pytest.mark.parametrize("how", ["oserror", "torch"])
def test_a_full_disk_while_writing_trainer_pt(tmp_path, how):
    """ENOSPC (an OSError, or torch's "unexpected pos" RuntimeError) in the middle of trainer.pt: one
    CheckpointError naming the checkpoint and the disk, the partial directory removed, the previous whole."""
    pytest.importorskip("torch")
    run = tmp_path / "run"
    previous = ck.write_checkpoint(run, {"version": 2}, FakeTrainer())
    with pytest.raises(CheckpointError) as exc:
        ck.write_checkpoint(run, {"version": 4}, FullDiskTrainer(how))
    message = str(exc.value)
    new = ck.checkpoint_root(run) / "ckpt-000004-2"
    assert message.startswith(f"checkpoint {new}: no space left on device (writing trainer.pt")
    assert previous.name in message and "--resume" in message and "\n" not in message
    _check_previous_intact(run, previous)


def test_a_full_disk_while_replacing_latest_json(tmp_path, monkeypatch):
    """ENOSPC when the new pointer is written (the new directory already renamed): that directory goes too,
    latest.json still names the previous checkpoint."""
    from mindspeed_asp.utils import atomic

    run = tmp_path / "run"
    previous = ck.write_checkpoint(run, {"version": 2}, FakeTrainer())

    def full(path, text, key=None):
        with atomic.atomic_open(path, key=key) as fh:
            fh.write(text[:4])
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck, "write_text", full)
    with pytest.raises(CheckpointError, match=r"no space left on device \(writing latest.json"):
        ck.write_checkpoint(run, {"version": 4}, FakeTrainer())
    _check_previous_intact(run, previous)


def test_the_trainer_removes_its_partial_file(tmp_path, trainer, monkeypatch):
    """GRPOTrainer.save_checkpoint on a full disk (torch.save into /dev/full): the error is torch's, and no
    trainer.pt.tmp is left to keep the disk full."""
    import torch

    real = torch.save

    def to_full_disk(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"\0" * 1000)
        real(obj, "/dev/full")

    monkeypatch.setattr(torch, "save", to_full_disk)
    with pytest.raises(RuntimeError, match="unexpected pos"):
        trainer.save_checkpoint(tmp_path / "trainer.pt")
    assert list(tmp_path.iterdir()) == []


# ============================================================================ end to end (slow)
FULL_AT_SECOND = """
import errno, sys
from mindspeed_asp.runtime import trainer as T
orig, calls = T.GRPOTrainer.save_checkpoint, []
def save(self, path):
    calls.append(path)
    if len(calls) == 2:  # the checkpoint at update 4: the disk is full
        open(path, "wb").write(b"0" * 100000)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    return orig(self, path)
T.GRPOTrainer.save_checkpoint = save
from mindspeed_asp.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _asp(code: str, args: List[str], log: Path) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=open(log.with_suffix(".out"), "w"),
                            stderr=open(log.with_suffix(".err"), "w"))


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_full_disk_run_is_locked_while_it_goes_then_resumes_from_the_previous_checkpoint(tmp_path, tiny_model):
    """`asp train` (6 updates, a checkpoint every 2) whose second checkpoint hits a full disk. While it runs, a
    `--resume` and an `--overwrite` of its directory are refused at once naming its pid, its metrics intact.
    It ends with one line naming the checkpoint and the disk, no temporary directory, the checkpoint of
    update 2 whole; `--resume` then finishes the run with each step once."""
    pytest.importorskip("vllm")
    pytest.importorskip("ray")
    out = tmp_path / "run"
    plain = "import sys; from mindspeed_asp.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = _asp(FULL_AT_SECOND, ["train", "--quiet", "--out", str(out), f"model.path={tiny_model}",
                                 "asp.instances=2", "run.steps=6", "run.checkpoint_every=2", "run.plots=false"],
                tmp_path / "a")
    deadline = time.time() + 900
    while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text():
        assert proc.poll() is None, (tmp_path / "a.err").read_text()[-3000:]
        assert time.time() < deadline, "the run did not reach its first update"
        time.sleep(0.5)
    for extra in (["--resume", str(out)], ["--out", str(out), "--overwrite"]):
        lines = len((out / "metrics.jsonl").read_text().splitlines())
        t0 = time.time()
        second = subprocess.run([sys.executable, "-c", plain, "train", "--quiet", *extra], capture_output=True,
                                text=True, timeout=120)
        assert second.returncode == 2 and time.time() - t0 < 60, second.stderr
        line = _one_error_line(second.stderr)
        assert str(out) in line and f"pid {proc.pid}" in line, line
        assert len((out / "metrics.jsonl").read_text().splitlines()) >= lines  # nothing truncated
    rc = proc.wait(timeout=900)
    err = (tmp_path / "a.err").read_text()
    assert rc == 2 and "Traceback" not in err, err[-3000:]
    errors = [x for x in err.splitlines() if ": error: " in x]
    assert len(errors) == 1, err[-3000:]
    line = errors[0]
    assert f"checkpoint {out / 'checkpoint'}" in line and "no space left on device" in line, line
    root = out / "checkpoint"
    assert not any(p.name.startswith(".tmp") for p in root.iterdir()), sorted(os.listdir(root))
    assert ck.read_state(ck.latest_checkpoint(out))["version"] == 2

    proc = _asp(plain, ["train", "--quiet", "--resume", str(out)], tmp_path / "b")
    rc = proc.wait(timeout=1200)
    err = (tmp_path / "b.err").read_text()
    assert rc == 0 and "Traceback" not in err, err[-3000:]
    steps = read_steps(out)
    assert [s["step"] for s in steps] == list(range(6))
    assert json.loads((out / "summary.json").read_text())["resumes"][0]["from_version"] == 2
    assert not (out / "run.lock").exists()


# ============================================================================ 5. a full disk between checkpoints
class _BrokenFile:
    """What `open` gives once the device fails with `errno` (EIO: a dying disk, EROFS: remounted read-only)."""

    def __init__(self, code: int) -> None:
        self.code, self.closed = code, False

    def write(self, text: str) -> int:
        raise OSError(self.code, os.strerror(self.code))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("how", ["enospc", "eio"])
def test_a_full_disk_while_appending_a_step_is_one_line_and_the_checkpoint_resumes(tmp_path, monkeypatch, how):
    """The disk fills (a real ENOSPC: metrics.jsonl is /dev/full) or fails (EIO) after the checkpoint at step 2,
    when step 2's line is appended: one RunError naming the file, the cause and the checkpoint to resume from
    (not a bare OSError); closing the recorder raises nothing more; the checkpoint is whole, and
    a recorder resumed from it rewrites metrics.jsonl to its steps and goes on."""
    from mindspeed_asp.runtime import run_recorder

    run = tmp_path / "run"
    rec = RunRecorder(run, mode="asp", instances=1, slots=4, minibatch_groups=1, max_lag=1)
    for k in range(2):
        rec.log_step({"step": k, "version": k + 1, "t_end": float(k)}, [0])
    previous = ck.write_checkpoint(run, {"version": 2, "recorder": rec.state_dict()}, FakeTrainer())
    rec.close()  # reopened for the next step, as after a resume
    if how == "enospc":
        (run / "metrics.jsonl").unlink()
        os.symlink("/dev/full", run / "metrics.jsonl")
    else:
        monkeypatch.setattr(run_recorder, "open", lambda *a, **k: _BrokenFile(errno.EIO), raising=False)
    with pytest.raises(RunError) as exc:
        rec.log_step({"step": 2, "version": 3, "t_end": 2.0}, [0])
    message = str(exc.value)
    cause = "No space left on device" if how == "enospc" else os.strerror(errno.EIO)
    assert message.startswith(f"{run / 'metrics.jsonl'}: cannot append step 2 ({cause}); the run stops"), message
    assert f"previous checkpoint {previous}" in message and f"--resume {run}" in message and "\n" not in message
    rec.close()
    _check_previous_intact(run, previous)
    monkeypatch.undo()
    if how == "enospc":
        (run / "metrics.jsonl").unlink()  # space freed
    resumed = RunRecorder(run, mode="asp", instances=1, slots=4, minibatch_groups=1, max_lag=1)
    resumed.load_state_dict(ck.read_state(ck.latest_checkpoint(run))["recorder"], defer_files=True)
    resumed.open_steps()
    resumed.log_step({"step": 2, "version": 3, "t_end": 2.0}, [0])
    resumed.close()
    assert [r["step"] for r in read_steps(run)] == [0, 1, 2]


def test_a_read_only_run_directory_is_one_line_before_the_first_step(tmp_path, monkeypatch):
    """metrics.jsonl cannot even be opened (EROFS): the same one line, naming the file and the cause."""
    from mindspeed_asp.runtime import run_recorder

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(args[0]))

    rec = RunRecorder(tmp_path, mode="asp", instances=1, slots=4, minibatch_groups=1, max_lag=1)
    monkeypatch.setattr(run_recorder, "open", read_only, raising=False)
    with pytest.raises(RunError, match=f"metrics.jsonl: cannot write it \\({os.strerror(errno.EROFS)}\\).*no "
                                       "checkpoint to resume from"):
        rec.open_steps()
    rec.close()


# ============================================================================ 6. lengths in a restored history
def test_a_zero_length_in_a_checkpointed_history_is_refused_naming_the_file_and_key(tmp_path):
    """A WindowPlanner's history goes through state.json and back; a 0 in it (which every file reader refuses,
    and `asp simulate` crashed on once saved) is refused on restore naming state.json and `planner`, and in
    `LengthHistory.add` itself, as are a boolean, a fraction and a length beyond 10^7."""
    import numpy as np

    from mindspeed_asp.config import AspSection
    from mindspeed_asp.runtime.replan import WindowPlanner
    from mindspeed_asp.scheduler.history import LengthHistory
    from mindspeed_asp.core.problem import PromptSet

    prompts = PromptSet(np.array(["p0", "p1"], dtype=object), np.array([5, 7]), n=2)
    planner = WindowPlanner(AspSection(), prompts, max_new_tokens=16, instances=1)
    planner.observe("p0", 0, [3, 4])
    planner.observe("p1", 0, [2, 9])
    state = ck.decode(json.loads(json.dumps(ck.encode(planner.state_dict()))))  # as state.json holds it
    restored = WindowPlanner(AspSection(), prompts, max_new_tokens=16, instances=1)
    with ck.restoring(tmp_path / "state.json", "planner"):
        restored.load_state_dict(state)
    assert restored.history.lengths_for(["p1"])[0][0].tolist() == [2, 9]
    state["history"][1]["lengths"] = [2, 0]
    with pytest.raises(InputError) as exc:
        with ck.restoring(tmp_path / "state.json", "planner"):
            restored.load_state_dict(state)
    message = str(exc.value)
    assert str(tmp_path / "state.json") in message and "'planner'" in message, message
    assert "prompt 'p1' epoch 0" in message and "length 0" in message and "at least one token" in message
    for bad, words in (([0], "length 0"), ([True], "must be an integer"), ([2.5], "must be an integer"),
                       ([10**7 + 1], "out of range"), ([10**20], "out of range")):
        with pytest.raises(ValueError, match=words):
            LengthHistory().add("p", 0, bad)
    with pytest.raises(ValueError, match="epoch 1: length 0"):
        LengthHistory().add_epoch(["a", "b"], 1, np.array([[3, 1], [0, 2]]))
