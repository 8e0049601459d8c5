"""The command line: parse, call, print. Heavy imports happen inside commands, so `--help` and
`validate` never load TensorFlow. Bad input exits with code 2 and one line on stderr."""

from __future__ import annotations

import errno
import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable

import click

from compress_dqn import __version__
from compress_dqn.deploy import registry
from compress_dqn.errors import UserError, WriteRefused, refusal_errno
from compress_dqn.recipe.presets import VARIANT_PRESETS, preset_for, search_block

EXIT_USAGE = 2
_MAX_MESSAGE = 1000
# OS errors that say a path the user gave cannot be used as asked: one line, not a traceback. A
# refusal to read reads the same as one to write here (the writers word their own as WriteRefused).
_PATH_ERRNOS = (errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENAMETOOLONG)


def _user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn UserError into `error: ...` on stderr and exit code 2; Ctrl-C into a resume hint.

    Last resort for writers that do not say so themselves: an OSError on a full or read-only disk,
    or a TensorFlow error carrying one, reads as the writers' own WriteRefused line."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            _exit_with(exc)
        except KeyboardInterrupt:
            click.echo("interrupted; rerun the same command to resume", err=True)
            sys.exit(130)
        except OSError as exc:
            if exc.errno in _PATH_ERRNOS and exc.filename:  # an --out, a path in the recipe, a run directory
                click.echo(f"error: {exc.filename}: {exc.strerror}; check the path and its permissions, "
                           "or pass another one (e.g. --out)", err=True)
                sys.exit(EXIT_USAGE)
            code = refusal_errno(exc)  # a full or read-only disk
            if code is None:
                raise
            _exit_with(WriteRefused(code, exc.filename))
        except Exception as exc:
            code = refusal_errno(exc) if type(exc).__module__.startswith("tensorflow.") else None
            if code is None:
                raise
            _exit_with(WriteRefused(code))

    return wrapper


def _exit_with(exc: UserError) -> None:
    """`error: ...` on stderr, one line always (a key or value from the user may itself hold a line
    break, a pasted value must not turn it into a screenful), and exit code 2."""
    message = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(exc))
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 3] + "..."
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_USAGE)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="compress-dqn")
def main() -> None:
    """Train a DQN baseline, compress it, export slim policies and measure what it cost."""


def _load(recipe: str, seed: int | None, overrides: tuple[str, ...]):
    from compress_dqn.recipe.schema import load_recipe

    extra = list(overrides)
    if seed is not None:
        extra.append(f"seed={seed}")
    loaded = load_recipe(recipe, extra)
    if seed is not None and loaded.seeds is not None:
        raise UserError(f"--seed {seed}: {recipe} trains every seed in its seeds: {loaded.seeds}; "
                        f"use --set 'seeds=[{seed}]' to train only that one")
    return loaded


def _echo_outcome(outcome: Any) -> None:
    from compress_dqn.store.layout import RunLayout

    layout = RunLayout(outcome.run_dir)
    click.echo(json.dumps({"run_dir": str(layout.root), "baseline_return": outcome.baseline_return,
                           "report": str(layout.report), "results": str(layout.results)}))


_set_option = click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE",
    help="Override a recipe key, e.g. --set train.total_timesteps=1000 (repeatable).",
)


@main.command()
@click.argument("recipe", type=click.Path(dir_okay=True, path_type=str))
@click.option("--out", type=click.Path(path_type=Path), help="Run directory (default: runs/NAME[-seedN]). An interrupted run there is resumed.")
@click.option("--seed", type=int, help="Override the recipe's seed.")
@_set_option
@click.option("--quiet", is_flag=True, help="No progress output.")
@_user_errors
def run(recipe: str, out: Path | None, seed: int | None, overrides: tuple[str, ...], quiet: bool) -> None:
    """Train, export and evaluate the recipe's policies; writes RUN_DIR/results.json."""
    loaded = _load(recipe, seed, overrides)
    run_dir = out or Path("runs") / (loaded.name if seed is None else f"{loaded.name}-seed{seed}")
    from compress_dqn.run.entry import run_recipe

    _echo_outcome(run_recipe(loaded, run_dir, quiet=quiet, log=lambda m: click.echo(m, err=True)))


def _byo_options(command: Callable) -> Callable:
    """The options of a command that takes a Q-network trained elsewhere."""
    options = [
        click.argument("model", type=click.Path(path_type=Path)),
        click.option("--env", "env_id", required=True,
                     help="Gymnasium environment id the model was trained on, or package.module:Id (imports the "
                          "module, which registers Id; see --set env.kwargs.K=V, env.wrappers)."),
        click.option("--out", type=click.Path(path_type=Path), help="Run directory (default: runs/MODEL_STEM)."),
        click.option("--transitions", type=click.Path(path_type=Path), help="An .npz of transitions instead of a rollout."),
        click.option("--rollout-steps", type=click.IntRange(min=1), default=20_000, show_default=True),
        click.option("--epsilon", type=click.FloatRange(0, 1), default=0.3, show_default=True, help="Rollout exploration."),
        click.option("--frame-stack", type=click.IntRange(min=1), default=1, show_default=True),
        click.option("--episodes", type=click.IntRange(min=1), default=100, show_default=True, help="Evaluation episodes."),
        click.option("--max-episodes", type=click.IntRange(min=1), default=1600, show_default=True,
                     help="While a verdict is undecided, double its episodes up to this many (eval.max_episodes); "
                          "raise it and rerun on the same --out to decide more."),
        click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True),
        click.option("--quiet", is_flag=True, help="No progress output."),
        _set_option,
    ]
    for option in reversed(options):
        command = option(command)
    return command


@main.command()
@_byo_options
@click.option("--variants", default="ptq-int8,prune-90-int8", show_default=True,
              help="Comma-separated presets: " + ", ".join(VARIANT_PRESETS) + ". ptq-int8 rounds the network as "
                   "trained: on the RL Zoo's DQN CartPole, Acrobot and MountainCar agents its int8 hidden layers change "
                   "the actions and a float Q-head would not save it (docs/rl-zoo.md); qat-int8 or a student keeps them.")
@_user_errors
def compress(model: Path, env_id: str, variants: str, out: Path | None, transitions: Path | None, rollout_steps: int,
             epsilon: float, frame_stack: int, episodes: int, max_episodes: int, seed: int, quiet: bool,
             overrides: tuple[str, ...]) -> None:
    """Compress a Q-network trained elsewhere (.keras, .h5, Keras SavedModel, Stable-Baselines3 DQN or
    sb3-contrib QR-DQN .zip of any SB3 release, PyTorch state dict .pt/.pth/.cleanrl_model, .onnx, a
    TF-Agents PolicySaver directory, an RLlib DQN checkpoint, or a compress-dqn run directory): a one-off recipe.

    The run directory's recipe.yaml is the recipe this made; `compress-dqn run` takes it as is.
    """
    names = [name.strip() for name in variants.split(",") if name.strip()]
    unknown = [name for name in names if name not in VARIANT_PRESETS]
    if unknown or not names:
        raise UserError(f"--variants: unknown preset {', '.join(unknown) or '(none given)'}; "
                        f"choose from {', '.join(VARIANT_PRESETS)}")
    from compress_dqn.recipe.schema import recipe_from_data
    from compress_dqn.run.entry import run_recipe
    from compress_dqn.run.model_recipe import recipe_for_model

    made = recipe_for_model(model, env_id, transitions, rollout_steps, epsilon, frame_stack, episodes, max_episodes, seed,
                            overrides)
    data = made.data
    data["variants"] = [{"name": n, **preset_for(n, made.keep_dense, made.flat)} for n in names]
    recipe = recipe_from_data(data, "compress", overrides)
    _echo_outcome(run_recipe(recipe, out or Path("runs") / data["name"], quiet=quiet,
                             log=lambda m: click.echo(m, err=True)))


def _students(text: str) -> list[Any]:
    """--students: 64x64,32x32 (MLPs) or c8k3-32 (8 3x3 filters, then 32 units), as the search names them."""
    from compress_dqn.run.ladders import parse_student

    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            student = parse_student(part)
        except ValueError:
            raise UserError(f"--students: {part!r} is not a student like 64x64 or c8k3-32 "
                            "(conv layers cFILTERSkKERNEL[sSTRIDE], then hidden widths)") from None
        out.append(student if isinstance(student, list) else student.model_dump(mode="json", include={"conv", "net_arch"}))
    return out


@main.command()
@_byo_options
@click.option("--objective", type=click.Choice(["gzip_bytes", "params", "latency"]), default="gzip_bytes", show_default=True)
@click.option("--students", default="64x64,48x48,32x32,16x16,8x8", show_default=True,
              help="Students to try: hidden widths (32x32), conv layers first for images (c8k3-32); '' for none.")
@click.option("--sparsities", default="0.8,0.9,0.95", show_default=True, help="Pruning targets to try ('' for none).")
@click.option("--tolerance", type=click.FloatRange(0, 1, min_open=True), default=0.01, show_default=True,
              help="Share of (baseline - random) return a policy may lose.")
@_user_errors
def search(model: Path, env_id: str, out: Path | None, transitions: Path | None, rollout_steps: int, epsilon: float,
           frame_stack: int, episodes: int, max_episodes: int, seed: int, quiet: bool, overrides: tuple[str, ...],
           objective: str, students: str, sparsities: str, tolerance: float) -> None:
    """Find the smallest policy that keeps a Q-network's return (trained elsewhere): a one-off search recipe."""
    try:
        targets = [float(x) for x in sparsities.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--sparsities: {sparsities!r} is not a list like 0.8,0.9,0.95") from None
    widths = _students(students)
    from compress_dqn.recipe.schema import recipe_from_data
    from compress_dqn.run.entry import run_recipe
    from compress_dqn.run.model_recipe import recipe_for_model

    made = recipe_for_model(model, env_id, transitions, rollout_steps, epsilon, frame_stack, episodes, max_episodes, seed,
                            overrides)
    data = made.data
    data["eval"] = {**data["eval"], "tolerance": tolerance}
    data["search"] = search_block(objective, widths, targets, made.keep_dense, made.flat)
    recipe = recipe_from_data(data, "search", overrides)
    _echo_outcome(run_recipe(recipe, out or Path("runs") / f"{data['name']}-search", quiet=quiet,
                             log=lambda m: click.echo(m, err=True)))


@main.command()
@click.argument("recipe", type=click.Path(dir_okay=True, path_type=str))
@click.option("--seed", type=int, help="Override the recipe's seed.")
@_set_option
@_user_errors
def validate(recipe: str, seed: int | None, overrides: tuple[str, ...]) -> None:
    """Check a recipe and its environment without training (and without importing TensorFlow)."""
    loaded = _load(recipe, seed, overrides)
    from compress_dqn.run.resources import check_recipe

    checked = check_recipe(loaded, Path("runs") / loaded.name)
    info, needed = checked.info, checked.needed
    click.echo(
        f"ok: {recipe}: {loaded.env.id} (obs {info.obs_shape} {info.obs_dtype}, {info.n_actions} actions), "
        f"{loaded.train.total_timesteps} steps, replay {needed.replay_capacity} transitions = "
        f"{needed.replay_bytes / 2**20:.1f} MiB; needs ~{needed.memory_bytes / 2**30:.1f} GiB of memory and "
        f"~{needed.disk_bytes / 2**30:.2f} GiB of disk per seed"
    )
    if checked.replay_expectation is not None:
        click.echo(checked.replay_expectation)
    modules = loaded.env.user_modules()
    if modules:  # the user's own code ran here, and runs in every process that builds the environment
        click.echo(f"note: building the environment imports {', '.join(modules)}, running its code (here, and in "
                   "every worker: installed there or on PYTHONPATH)")
    if checked.machine_problem is not None:  # the recipe is valid; whether this machine can run it is a warning
        click.echo(f"warning: on this machine, {checked.machine_problem}", err=True)
    if loaded.baseline is None and loaded.train.learning_starts >= loaded.train.total_timesteps:
        click.echo(f"warning: train.learning_starts ({loaded.train.learning_starts}) is not below "
                   f"train.total_timesteps ({loaded.train.total_timesteps}): no gradient step will run", err=True)


@main.command()
@click.argument("policy", type=click.Path(path_type=Path))
@click.option("--env", "env_id", required=True, help="Gymnasium environment id, e.g. CartPole-v1, or package.module:Id.")
@click.option("--episodes", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Episodes use seeds SEED..SEED+EPISODES-1.")
@click.option("--runtime", type=click.Choice(["litert", "micro"]), default="litert", show_default=True,
              help="micro: play a .tflite through the TFLite Micro interpreter, as a microcontroller would.")
@click.option("--set", "overrides", multiple=True, metavar="env.KEY=VALUE",
              help="The environment's settings, e.g. --set env.kwargs.length=6, env.max_episode_steps, env.wrappers.")
@_user_errors
def evaluate(policy: Path, env_id: str, episodes: int, seed: int, runtime: str, overrides: tuple[str, ...]) -> None:
    """Play greedy episodes with a .tflite file or SavedModel directory; prints JSON."""
    from compress_dqn.run.policy_file import evaluate_policy_file

    other = [o for o in overrides if o.partition("=")[0].strip().split(".")[0] != "env"]
    if other:
        raise UserError(f"--set {other[0]!r}: evaluate takes env.* keys only (env.kwargs.K=V, env.max_episode_steps, "
                        "env.wrappers)")
    stats = evaluate_policy_file(policy, env_id, episodes, seed, runtime, overrides)
    click.echo(json.dumps({"policy": str(policy), "env_id": env_id, "seed": seed, "runtime": runtime,
                           "return": stats.to_dict()}))


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--gpu", "gpu_files", multiple=True, type=click.Path(path_type=Path),
              help="Attach a `bench POLICY.onnx --device gpu --out FILE` file (repeatable): the report's GPU serving section.")
@_user_errors
def report(run_dir: Path, gpu_files: tuple[Path, ...]) -> None:
    """Re-render results.csv, report.md, report.html and the plots from RUN_DIR/results.json."""
    from compress_dqn.evaluation.serving.attach import attach
    from compress_dqn.evaluation.report import write_report
    from compress_dqn.store.layout import RunLayout
    from compress_dqn.store.manifest import verify as verify_run
    from compress_dqn.store.manifest import write_manifest

    layout = RunLayout(run_dir)
    finished = layout.manifest.is_file()
    if finished:  # the manifest is rewritten below: never sign altered artifacts into it
        problems = verify_run(run_dir)
        if problems:
            raise UserError(f"{run_dir}: {len(problems)} artifact(s) no longer match manifest.json ({problems[0]}); "
                            "restore them, or rerun the recipe with another --out")
    if gpu_files or layout.gpu_figures.is_dir():  # figures measured on a GPU machine, attached (or held) here
        attach(layout.results, layout.gpu_figures, gpu_files)
    for path in write_report(run_dir):
        click.echo(str(path))
    if finished:
        write_manifest(run_dir)  # the re-rendered report files are the run's artifacts now


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@_user_errors
def verify(run_dir: Path) -> None:
    """Check every artifact of a finished run against RUN_DIR/manifest.json (SHA-256 and size)."""
    from compress_dqn.store.manifest import read_manifest
    from compress_dqn.store.manifest import verify as verify_run

    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such directory; pass a run directory written by compress-dqn run")
    problems = verify_run(run_dir)
    count = len(read_manifest(run_dir).files)
    if problems:
        raise UserError(f"{run_dir}: {len(problems)} problem(s) in {count} artifacts: " + "; ".join(problems))
    click.echo(f"ok: {run_dir}: {count} artifacts match manifest.json")


@main.command()
@click.argument("policy", type=click.Path(path_type=Path))
@click.option("--calls", type=click.IntRange(min=100), default=2000, show_default=True, help="Timed batch-1 calls.")
@click.option("--memory/--no-memory", default=True, show_default=True, help="Also measure peak RSS in a fresh process.")
@click.option("--device", type=click.Choice(["gpu", "cpu"]),
              help="Serve POLICY.onnx (export --target onnx) by batch on a GPU (cpu: the same code on the CPU device) "
                   "against onnxruntime on this machine's CPU; no TensorFlow (docs/measurements.md).")
@click.option("--batches", default="1,64,1024,16384", show_default=True, help="--device: the batch sizes.")
@click.option("--seconds", type=click.FloatRange(min=0.001), default=0.5, show_default=True,
              help="--device: timing budget per runtime and batch.")
@click.option("--name", help="--device: the policy's name in its run (default: the file's stem, as export names it).")
@click.option("--out", type=click.Path(path_type=Path), help="--device: also write the JSON here (for report RUN --gpu FILE).")
@_user_errors
def bench(policy: Path, calls: int, memory: bool, device: str | None, batches: str, seconds: float, name: str | None,
          out: Path | None) -> None:
    """Measure one .tflite file or SavedModel directory: size, latency, inference memory; or an .onnx by batch on a device (JSON)."""
    if device is not None or policy.suffix == ".onnx":
        from compress_dqn.evaluation.serving.bench import bench_file

        if device is None:
            raise UserError(f"{policy}: an .onnx file is measured by batch on a device: add --device gpu (or cpu)")
        click.echo(json.dumps(bench_file(policy, device, batches, name, out, seconds)))
        return
    from compress_dqn.run.policy_file import bench_policy_file

    click.echo(json.dumps(bench_policy_file(policy, calls, memory).model_dump()))


@main.command()
@click.argument("policy", type=click.Path(path_type=Path))
@click.option("--target", type=click.Choice(list(registry.TARGETS)), default=registry.DEFAULT, show_default=True,
              help=registry.target_help())
@click.option("--out", type=click.Path(path_type=Path), help=registry.out_help())
@click.option("--int8-io", is_flag=True, help=registry.option_help("int8_io"))
@click.option("--name", help=registry.option_help("name"))
@click.option("--compress", "tflm_compress", is_flag=True, help=registry.option_help("compress"))
@click.option("--onnx-int8", type=click.Choice(["exact", "qdq"]), help=registry.option_help("onnx_int8"))
@_user_errors
def export(policy: Path, target: str, out: Path | None, int8_io: bool, name: str | None, tflm_compress: bool,
           onnx_int8: str | None) -> None:
    """Export a .tflite policy for one runtime (--target), with what it costs there; prints JSON."""
    from compress_dqn.deploy.base import ExportOptions
    from compress_dqn.store.manifest import check_artifact

    check_artifact(policy)
    options = ExportOptions(int8_io=int8_io, name=name, compress=tflm_compress, onnx_int8=onnx_int8)
    click.echo(json.dumps(registry.export_policy(target, policy, out, options).to_dict()))


def run_in_process(args: list[str]) -> None:
    """`compress-dqn ARGS` through this entry point in the caller's process, as the benchmarks call it: their
    TensorFlow start serves their commands too. The command's own stdout goes to stderr, so the caller's stdout
    stays its JSON lines; a failed command exits the caller with one line naming it."""
    import contextlib

    try:
        with contextlib.redirect_stdout(sys.stderr):
            main.main(list(args), prog_name="compress-dqn", standalone_mode=False)
    except SystemExit as exc:
        if exc.code:
            sys.exit(f"compress-dqn {' '.join(args)} failed ({exc.code}), see above")


if __name__ == "__main__":  # pragma: no cover
    main()
