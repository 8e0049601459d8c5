"""A full or read-only disk, met by any writer of a run, ends in one line that names the path and the
fix (exit code 2), leaves no half-written temporary, keeps the previous complete file, and the
same command, rerun once there is space, resumes and finishes."""

from __future__ import annotations

import errno
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

from compress_dqn import fileio
from compress_dqn.cli import _user_errors, main
from compress_dqn.errors import UserError, WriteRefused
from compress_dqn.run.executors import map_units
from conftest import NO_C_FIGURES, NO_TF_MEMORY, ROOT, TINY

FULL = OSError(errno.ENOSPC, "No space left on device")


def _fail_with(exc: BaseException):
    def fail(*args, **kwargs):
        raise exc
    return fail


def test_a_refused_write_is_one_line_naming_the_path_and_the_fix_and_keeps_the_previous_file(tmp_path, monkeypatch):
    target = tmp_path / "stages.json"
    fileio.write_text_atomic(target, "complete")
    monkeypatch.setattr(fileio.os, "fsync", _fail_with(FULL))  # the data went out, the disk refused it
    with pytest.raises(WriteRefused) as raised:
        fileio.write_text_atomic(target, "new")
    message = str(raised.value)
    assert message.startswith(f"cannot write {target}: no space left on device; free some space")
    assert "rerun the same command" in message and "\n" not in message
    assert target.read_text() == "complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stages.json"]  # no .tmp- left behind

    monkeypatch.setattr(fileio.os, "fsync", _fail_with(OSError(errno.EROFS, "Read-only file system")))
    with pytest.raises(WriteRefused, match=r"weights.npz: read-only file system; remount it read-write \(or pass another --out\)"):
        fileio.save_arrays(tmp_path / "weights.npz", [np.zeros(3)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stages.json"]


def test_other_write_failures_are_not_worded_as_a_full_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(fileio.os, "fsync", _fail_with(OSError(errno.EIO, "Input/output error")))
    with pytest.raises(OSError) as raised:
        fileio.write_bytes_atomic(tmp_path / "x", b"x")
    assert not isinstance(raised.value, UserError) and raised.value.errno == errno.EIO
    assert list(tmp_path.iterdir()) == []


def test_replace_dir_keeps_the_previous_directory_when_the_swap_is_refused(tmp_path, monkeypatch):
    final, new = tmp_path / "saved_model", tmp_path / ".tmp-saved_model"
    final.mkdir()
    (final / "old").write_text("kept")
    new.mkdir()
    real_replace = os.replace

    def refuse_the_new_one(src, dst):
        if Path(src) == new:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(fileio.os, "replace", refuse_the_new_one)
    with pytest.raises(WriteRefused, match="saved_model: no space left on device"):
        fileio.replace_dir(new, final)
    assert (final / "old").read_text() == "kept"


def test_a_checkpoint_refused_names_the_checkpoint_and_says_the_last_one_is_intact(tmp_path):
    from compress_dqn.rl.train_state import write_checkpoint_dir

    ckpt = tmp_path / "checkpoints"
    write_checkpoint_dir(ckpt, "step-000000100", lambda d: fileio.write_text_atomic(d / "state.json", "{}"))

    def full_disk(directory: Path) -> None:
        (directory / "partial").write_bytes(b"x" * 100)
        fileio.save_arrays(directory / "replay.npz", {"x": np.zeros(2)})

    real_fsync = os.fsync
    fileio.os.fsync = _fail_with(FULL)
    try:
        with pytest.raises(WriteRefused) as raised:
            write_checkpoint_dir(ckpt, "step-000000200", full_disk)
    finally:
        fileio.os.fsync = real_fsync
    assert str(raised.value).startswith(f"cannot write {ckpt / 'step-000000200'}: no space left on device "
                                        "(the last good checkpoint step-000000100 is intact); free some space")
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step-000000100"]


def test_tensorflow_writers_word_their_refusals_the_same(tmp_path, monkeypatch):
    from compress_dqn._tf import tf
    from compress_dqn.convert import conversion
    from compress_dqn.rl.networks import build_q_network
    from compress_dqn.rl.trainer import RunLog, RunOptions, TrainState

    full = tf.errors.ResourceExhaustedError(None, None, "/x/events.out.tfevents.1; No space left on device\n\t"
                                            "Failed to flush 1 events")
    log = RunLog(RunOptions(env_config=None, tb_dir=tmp_path / "tb", quiet=True), 100, TrainState())
    monkeypatch.setattr(tf.summary, "scalar", _fail_with(full))
    with pytest.raises(WriteRefused, match=f"cannot write {tmp_path / 'tb'}: no space left on device; free some space"):
        log.scalar("train/loss", 1.0, 1)
    monkeypatch.setattr(log.writer, "flush", _fail_with(full))
    log.close(1, failing=True)  # the loop's own failure is the one reported
    with pytest.raises(WriteRefused):
        log.close(1)

    model = build_q_network((4,), 2, [8])
    conversion.export_saved_model(model, (4,), np.float32, tmp_path / "saved_model")
    monkeypatch.setattr(tf.saved_model, "save", _fail_with(OSError(errno.EROFS, "Read-only file system")))
    with pytest.raises(WriteRefused, match="saved_model: read-only file system"):
        conversion.export_saved_model(model, (4,), np.float32, tmp_path / "saved_model")
    assert (tmp_path / "saved_model" / "saved_model.pb").is_file()  # the previous export stays
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def _cli_raising(exc: BaseException) -> click.Command:
    @click.command()
    @_user_errors
    def command() -> None:
        raise exc
    return command


def test_the_command_line_words_a_missed_writers_refusal_as_one_line():
    result = CliRunner().invoke(_cli_raising(OSError(errno.ENOSPC, "No space left on device", "runs/x/report.md")))
    assert result.exit_code == 2
    assert result.output == ("error: cannot write runs/x/report.md: no space left on device; free some space "
                             "(or pass another --out) and rerun the same command: a run resumes where it stopped\n")

    tf_error = type("ResourceExhaustedError", (Exception,), {"__module__": "tensorflow.python.framework.errors_impl"})
    result = CliRunner().invoke(_cli_raising(tf_error("runs/x/tb/events; Disk quota exceeded")))
    assert result.exit_code == 2 and result.output.startswith("error: cannot write: disk quota exceeded; free some space")
    assert len(result.output.splitlines()) == 1

    result = CliRunner().invoke(_cli_raising(OSError(errno.EIO, "Input/output error")))
    assert result.exit_code == 1 and isinstance(result.exception, OSError)  # not a disk the user can fix


def refuse_in_worker(path: str) -> None:
    raise WriteRefused(errno.ENOSPC, path, " (the last good checkpoint step-1 is intact)")


def test_a_refusal_in_a_worker_process_reaches_the_user_as_the_same_line():
    expected = str(WriteRefused(errno.ENOSPC, "runs/x/a", " (the last good checkpoint step-1 is intact)"))
    assert str(pickle.loads(pickle.dumps(WriteRefused(errno.ENOSPC, "runs/x/a", " (the last good checkpoint "
                                                                                "step-1 is intact)")))) == expected
    with pytest.raises(WriteRefused) as raised:
        map_units(refuse_in_worker, [("runs/x/a",), ("runs/x/a",)], workers=2)
    assert str(raised.value) == expected


def test_the_up_front_disk_check_itemizes_what_it_counts(tmp_path, monkeypatch):
    from compress_dqn.envs.environment import probe_env
    from compress_dqn.recipe.schema import load_recipe
    from compress_dqn.replay.buffer import format_bytes
    from compress_dqn.run import resources

    recipe = load_recipe(TINY, [])
    needed = resources.plan(recipe, probe_env(recipe.env))
    parts = needed.disk_parts()
    assert sum(size for _, size in parts) == needed.disk_bytes
    usage = resources.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(resources.shutil, "disk_usage", lambda p: usage._replace(free=1 << 20))
    with pytest.raises(UserError) as raised:
        resources.check(needed, tmp_path / "run", in_total=2)
    message = str(raised.value)
    assert f"needs about {format_bytes(2 * needed.disk_bytes, decimals=1)} of disk" in message
    assert message.count(" + ") == len(parts) - 1 and "2 seeds x (" in message
    for what, size in parts:
        assert f"{format_bytes(size, decimals=1)} for {what}" in message
    assert "exports, reports and TensorBoard" in message and "replay buffer" in message

    memory = resources.psutil.virtual_memory()
    monkeypatch.setattr(resources.psutil, "virtual_memory", lambda: memory._replace(available=1 << 20))
    with pytest.raises(UserError) as raised:
        resources.check(needed, tmp_path / "run", at_once=2)
    message = str(raised.value)
    assert f"needs about {format_bytes(2 * needed.memory_bytes, decimals=1)} of memory (2 runs at once x (" in message
    assert (needed.replay_bytes + needed.network_bytes + resources._PROCESS_OVERHEAD) == needed.memory_bytes
    for size in (needed.replay_bytes, needed.network_bytes, resources._PROCESS_OVERHEAD):
        assert format_bytes(size, decimals=1) in message


def test_a_brought_baseline_plans_for_its_data_not_for_a_buffer_it_never_trains(tmp_path, monkeypatch):
    """compress of an RL Zoo Atari agent (buffer_size 100k-1M of 84x84x4 frames) once asked for ~20 GiB of disk for
    a 200-step rollout and was refused on a machine with 17 GiB free: nothing trains, so no checkpoints either."""
    import numpy as np

    from compress_dqn.envs.environment import probe_env
    from compress_dqn.recipe.schema import recipe_from_data
    from compress_dqn.replay.buffer import ReplayBuffer
    from compress_dqn.run import resources

    data = {"name": "brought", "env": {"id": "CartPole-v1"}, "train": {"buffer_size": 1_000_000},
            "baseline": {"from": str(tmp_path / "q.keras"), "rollout": {"steps": 200}}}
    recipe = recipe_from_data(data)
    info = probe_env(recipe.env)
    row = ReplayBuffer.bytes_per_row(info.obs_shape, info.obs_dtype, info.n_actions)
    needed = resources.plan(recipe, info)
    assert needed.replay_capacity == 302 and needed.replay_bytes == 302 * row  # 200 steps + episode starts
    assert needed.disk_bytes == needed.replay_bytes + sum(size for what, size in needed.disk_parts()
                                                         if "exports" in what)
    trained = resources.plan(recipe.model_copy(update={"baseline": None}), info)
    assert trained.replay_capacity == 1_000_000 and trained.disk_bytes > 3 * 1_000_000 * row

    np.savez(tmp_path / "t.npz", actions=np.zeros(40, np.int64))
    data["baseline"] = {"from": str(tmp_path / "q.keras"), "transitions": str(tmp_path / "t.npz")}
    assert resources.plan(recipe_from_data(data), info).replay_capacity == 80  # 2 rows each, unrelated transitions
    other = tmp_path / "other" / "baseline"  # another run's baseline: the replay it trained on, at its file's size
    other.mkdir(parents=True)
    for name in ("recipe.yaml", "stages.json", "baseline/weights.npz"):
        (other.parent / name).write_bytes(b"{}")
    (other / "replay.npz").write_bytes(bytes(100 * row))
    data["baseline"] = {"from": str(other.parent)}
    assert resources.plan(recipe_from_data(data), info).replay_bytes == 100 * row
    usage = resources.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(resources.shutil, "disk_usage", lambda p: usage._replace(free=1 << 10))
    with pytest.raises(UserError, match=r"brought baseline's data .* lower baseline.rollout.steps"):
        resources.check(needed, tmp_path / "run")


# -- a real full disk, mid-run -----------------------------------------------------------------


def _mount_small_disk(mount_point: Path, size_mb: int) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")


def _fill(directory: Path) -> Path:
    """Write until the disk is full; the file that filled it."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * (1 << 16))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        try:
            while True:  # the last pages
                fh.write(b"\0" * 512)
        except OSError:
            pass
    return filler


def _values_of(record: object, key: str) -> list[object]:
    """Every value stored under key, at any depth."""
    if isinstance(record, dict):
        return [v for k, item in record.items() for v in ([item] if k == key else _values_of(item, key))]
    if isinstance(record, list):
        return [v for item in record for v in _values_of(item, key)]
    return []


RUN_OVERRIDES = ["train.total_timesteps=1500", "train.checkpoint_interval=500", NO_TF_MEMORY, NO_C_FIGURES]
"""Long enough to fill the disk after the first checkpoint and before the run ends; the next
checkpoint is far, so the TensorBoard writer (whose TensorFlow traceback this test was written for)
usually meets the full disk first. Whichever writer does, the line must be the same kind. The test
reads no TensorFlow memory or C figure."""


@pytest.mark.slow
def test_a_disk_that_fills_while_a_run_trains_ends_in_one_line_and_the_rerun_finishes(tmp_path):
    disk = tmp_path / "disk"
    _mount_small_disk(disk, 80)  # the up-front check wants ~64 MiB free for the tiny recipe
    try:
        out = disk / "run"
        args = ["run", str(TINY), "--out", str(out), "--quiet", *[a for o in RUN_OVERRIDES for a in ("--set", o)]]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        process = subprocess.Popen([sys.executable, "-m", "compress_dqn", *args], cwd=ROOT,
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        checkpoints = out / "baseline" / "checkpoints"
        deadline = time.monotonic() + 120
        while not (checkpoints / "latest").exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert process.poll() is None, "the run ended before its first checkpoint: " + process.stderr.read()
        filler = _fill(disk)
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 2, stderr
        assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
        assert stderr.startswith(f"error: cannot write {out}/") and "no space left on device" in stderr, stderr
        assert "free some space (or pass another --out) and rerun the same command" in stderr, stderr

        kept = (checkpoints / "latest").read_text().strip()
        assert (checkpoints / kept / "state.json").is_file()
        assert not [p for p in checkpoints.iterdir() if p.name.startswith(".tmp-")]

        filler.unlink()
        # The rerun and verify need no user's process (the failing run above was one): click's runner
        # in this one, sparing a TensorFlow import.
        resumed = CliRunner().invoke(main, args)
        assert resumed.exit_code == 0, (resumed.output, resumed.exception)
        stages = json.loads((out / "stages.json").read_text())
        assert _values_of(stages, "resumed_from_step") == [int(kept.removeprefix("step-"))]
        verified = CliRunner().invoke(main, ["verify", str(out)])
        assert verified.exit_code == 0, verified.output
    finally:
        fileio.release_run_dir(disk / "run")  # the rerun's lock on the run: let the mount go
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
