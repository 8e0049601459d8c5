"""kill -9 `compress-dqn run` at random moments, resume, and check every resumed run.

    .venv/bin/python benchmarks/kill_resume.py --kills 20 --out runs/kill-resume
    .venv/bin/python benchmarks/kill_resume.py --search --kills 10 --out runs/kill-resume-search
    .venv/bin/python benchmarks/kill_resume.py --smoke --out runs/kill-resume-smoke   # one kill of a tiny run

One uninterrupted reference run first; then trials, each in a fresh directory: the same command
is started and SIGKILLed at a uniformly random time within the reference's wall time, one to three
times in a row, then rerun to completion. Every finished trial must pass `compress-dqn verify` and,
the run being deterministic on CPU with a fixed seed, give the reference's per-episode returns and
byte-identical TFLite files. Prints a JSON line per trial and a summary line.

--smoke runs the reference and the final resume in this process (click's runner: the same command,
no TensorFlow import of their own) and times its one kill from the trial's run start (its
recipe.yaml), not its interpreter's: a tiny run is mostly that interpreter's TensorFlow import.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OVERRIDES = [
    "train.total_timesteps=3000", "train.checkpoint_interval=500", "eval.episodes=5",
    "variants=[{name: ptq-int8, quantize: {mode: int8, calibration_samples: 50}}, "
    "{name: prune-50, prune: {sparsity: 0.5}, fine_tune: {steps: 300}}]",
]


SEARCH_OVERRIDES = [
    "train.total_timesteps=3000", "train.checkpoint_interval=500", "eval.episodes=5", "seeds=[0, 1]",
    "search.students=[[8], [2]]", "search.student_quantize=float16", "search.student_fine_tune.steps=300",
    "eval.tolerance=1.0",
]


SMOKE_OVERRIDES = ["train.checkpoint_interval=100", "eval.episodes=2", "measure.saved_model_memory=none",
                   "measure.c_policy=none"]
"""--smoke: the tiny recipe's baseline alone (400 steps), one kill, no TensorFlow memory probe and no
C cross-compile (the fingerprint reads neither)."""


def command(recipe: str, out: Path, search: bool = False, smoke: bool = False) -> list[str]:
    args = [sys.executable, "-m", "compress_dqn", "run", recipe, "--out", str(out), "--quiet"]
    for override in SEARCH_OVERRIDES if search else SMOKE_OVERRIDES if smoke else OVERRIDES:
        args += ["--set", override]
    return args


def stage_reached(out: Path) -> str:
    try:
        done = list(json.loads((out / "stages.json").read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return "training" if (out / "baseline" / "checkpoints").exists() else "start"
    return f"after {done[-1]}" if done else "start"


def run_here(args: list[str]) -> tuple[int, str]:
    """`compress-dqn ARGS` (a command() less its interpreter) in this process: exit code, output."""
    from click.testing import CliRunner

    from compress_dqn.cli import main as cli

    result = CliRunner().invoke(cli, args)
    return result.exit_code, result.output + (repr(result.exception) if result.exit_code not in (0, 2) else "")


def kill_after(args: list[str], run_dir: Path, delay: float, from_run_start: bool) -> dict | None:
    """Start `args`, SIGKILL it `delay` seconds later (counted from its run's start, recipe.yaml
    written, with from_run_start); what it had reached, or None if it finished first."""
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while from_run_start and process.poll() is None and not (run_dir / "recipe.yaml").exists():
        time.sleep(0.02)
    try:
        process.wait(timeout=delay)  # finished before the kill time: nothing to kill
        return None
    except subprocess.TimeoutExpired:
        reached = {"after_s": round(delay, 2), "stage": stage_reached(run_dir)}
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        return reached


def run_to_end(args: argparse.Namespace, run_dir: Path) -> tuple[subprocess.CompletedProcess, float]:
    """Run (or resume) the command into run_dir to its end: how it ended (exit code, stderr) and its
    wall seconds. --smoke runs it in this process, TensorFlow imported before the clock starts (the
    kill's delay counts from a run's start, after its interpreter's imports)."""
    cmd = command(args.recipe, run_dir, args.search, args.smoke)
    if args.smoke:
        import compress_dqn._tf  # noqa: F401
    start = time.perf_counter()
    if args.smoke:
        code, output = run_here(cmd[3:])
        done = subprocess.CompletedProcess(cmd, code, "", output)
    else:
        done = subprocess.run(cmd, capture_output=True, text=True)
    return done, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "tiny.yaml"))
    parser.add_argument("--kills", type=int, default=20, help="kill at least this many times in all")
    parser.add_argument("--out", default="runs/kill-resume")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--search", action="store_true", help="kill a tiny 2-seed search instead of a run")
    parser.add_argument("--smoke", action="store_true", help="one kill of a shorter run: checks the script runs")
    args = parser.parse_args()
    if args.smoke:
        args.kills = 1
    from compress_dqn.store.manifest import run_fingerprint

    if args.search:  # compress_dqn.run.search imports TensorFlow: seconds this parent spends on nothing else
        from compress_dqn.run.search import search_fingerprint
    fingerprint = search_fingerprint if args.search else run_fingerprint

    rng = random.Random(args.seed)
    out = Path(args.out)

    start = time.perf_counter()
    reference = out / "reference"
    done, ref_wall = run_to_end(args, reference)
    if done.returncode != 0:
        raise SystemExit(f"the reference run failed: {done.stderr.strip()[-2000:]}")
    expected = fingerprint(reference)

    kills = trials = verified = identical = 0
    while kills < args.kills:
        run_dir = out / f"trial-{trials}"
        killed_at = []
        for _ in range(1 if args.smoke else rng.randint(1, 3)):
            # --smoke kills within the first half of the run (from its start): a later kill could miss it
            delay = rng.uniform(0.5, ref_wall / 2 if args.smoke else ref_wall)
            reached = kill_after(command(args.recipe, run_dir, args.search, args.smoke), run_dir, delay, args.smoke)
            killed_at += [reached] if reached else []
        final, _ = run_to_end(args, run_dir)
        check = subprocess.run([sys.executable, "-m", "compress_dqn", "verify", str(run_dir)], capture_output=True, text=True)
        ok = final.returncode == 0 and check.returncode == 0
        same = ok and fingerprint(run_dir) == expected
        kills += len(killed_at)
        trials += 1
        verified += ok
        identical += same
        print(json.dumps({"trial": trials - 1, "kills": killed_at, "resumed": final.returncode == 0,
                          "verified": check.returncode == 0, "identical_to_reference": same,
                          "error": None if ok else (final.stderr or check.stderr).strip()[-300:]}), flush=True)
    print(json.dumps({"kills": kills, "trials": trials, "verified": verified, "identical": identical,
                      "reference_wall_s": round(ref_wall, 1), "total_wall_s": round(time.perf_counter() - start, 1)}))


if __name__ == "__main__":
    main()
