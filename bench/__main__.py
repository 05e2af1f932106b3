"""`make bench`: ratios measured in one run (not timed tests).

  data      FD001 load + fit + transform + windows (target < 1 s)
  engine    rul's training loop vs a minimal hand-written loop, same model and batches
  tracking  the default `rul train` tracked vs untracked (target overhead <= 5%; ~8 min)
  accuracy  the default `make train` config: test RMSE (target <= 13.0) and wall time
  memory    make train's step, its effective batch B split as Bx1 .. B/8x8: peak memory and
            samples/s per precision (bench/memory.py; --quick: one timed step)
  split     the first epoch as 512x1, 256x2 and 128x4, per optimizer (each in its own recipe)
            and precision: the same skipped steps, per-step losses within each precision's bound
            (gpu_check.check_splits; fp16 on a CPU is emulated: ~10 min)
  mistakes  seconds from a mistyped command to its one-line error (target <= 2 s)
  lean      the registered model in a clean virtualenv of its own requirements: size, import,
            load_model (with and without MLflow's dependency check), predict latency
            (bench/lean.py; installs from the package index, ~1 min)
  speed     make train's training step: samples/s of each path vs fp32 eager; last line
            `speed ratio: R` (bench/speed.py; --compile adds torch.compile, --quick fewer
            rounds)
  members   5 ensemble members trained at once (stacked) vs one alone and vs the 5 one after
            another (fp32, and at precision auto): time, and each member's per-step
            difference from training it alone (bench/members.py)
  peers     the default recipe trained by rul's loop, PyTorch Lightning, Hugging Face
            Accelerate and a plain nanoGPT-style loop, each in its own process: samples/s and
            wall time as ratios to the plain loop, and the validation RMSE each reaches
            (bench/peers/; Lightning and Accelerate from the `peers` extra, skipped when
            missing; --epochs N (5), --dry-run: 2 epochs of 10 engines, a tiny DCNN)
  serving   the served model (default network, 1 epoch): peak memory per body format, the
            worst body and FD001's rows; one-engine latency alone and with a maximal body in
            flight; hostile clients (1,000 slow connections, 4 maximal bodies at once, each
            thing clients do wrong) (bench/serving.py; --quick: smaller; ~5 min)

python -m bench [data|engine|tracking|accuracy|memory|speed|mistakes|lean|members|peers|
                 serving|split ...]
                [--quick] [--compile] [--epochs N] [--dry-run] [--json DIR]
(default: data engine tracking memory speed)

--json DIR writes each bench's result to DIR/<bench>-<UTC time>.json with the machine it ran
on (rul/machine.py), the commit, the date and the command: what `rul report` turns into the
Performance page.
"""


import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "experiments" / "fd001.yaml"


def bench_data():
    from rul import config as cfg
    from rul.data import load_subset
    from rul.plan import data_settings
    from rul.preprocessing.prepared import fitted_preprocessor  # imports are not timed

    start = time.perf_counter()
    subset = load_subset("FD001")
    loaded = time.perf_counter()
    pre, _ = fitted_preprocessor(data_settings(cfg.load(DEFAULT)), subset, subset.train)
    windows = pre.window_set(subset.train)
    pre.last_windows(subset.test)
    done = time.perf_counter()
    print(f"data: load {loaded - start:.3f}s + fit/transform/window {done - loaded:.3f}s "
          f"= {done - start:.3f}s for {len(windows)} windows (target < 1 s)")
    return _summary({"FD001 load + fit + transform + windows (s)": round(done - start, 3),
                     "target (s)": "< 1"})


def minimal_loop(model, train, config, epochs):
    """What a person would write by hand: same batches, accumulation, clipping, AdamW and,
    when the config asks for them, torch's learning-rate schedule and stock EMA of the
    weights."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    from rul.plan import optimizer_settings
    from rul.training.optim import make_scheduler, steps_per_epoch

    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    schedule = make_scheduler(  # torch's, as the engine builds it
        optimizer, optimizer_settings(config),
        epochs * steps_per_epoch(len(train), config.effective_batch_size))
    ema = (AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(config.ema_decay),
                         use_buffers=True) if config.ema_decay else None)
    seen, start = 0, time.perf_counter()
    from rul.training.batching import effective_batches

    for epoch in range(epochs):
        for batch in effective_batches(len(train), config.effective_batch_size, 0, epoch):
            total = len(batch)
            for index in batch.split(config.micro_batch_size):
                x, y = train.get(index)
                cap = config.rul_cap
                loss = torch.nn.functional.mse_loss(model(x) / cap, y / cap) * len(y) / total
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if schedule is not None:
                schedule.step()
            if ema is not None:
                ema.update_parameters(model)
            seen += total
    return seen / (time.perf_counter() - start)


def bench_engine(epochs=3):
    from rul import config as cfg
    from rul.plan import network_of, plan_run, prepared
    from rul.training.batching import WindowBatches
    from rul.training.engine import fit
    from rul.training.seeding import derive_seeds

    config = cfg.load(DEFAULT, {"epochs": epochs, "patience": 100, "precision": "fp32",
                                "device": "cpu", "optimizer": "adamw"})  # the minimal loop's
    data = prepared(config, derive_seeds(config.seed).split)
    plan = plan_run(config, data=data)  # as `rul train` on a CPU (malloc's settings too)
    n_features = data.preprocessor.n_features
    train = WindowBatches(data.train, torch.device("cpu"))  # the minimal loop's
    rates = {"minimal": [], "rul": []}
    for _ in range(2):  # interleaved, best of two each
        torch.manual_seed(0)
        model = network_of(config, n_features).build()
        rates["minimal"].append(minimal_loop(model, train, config, epochs))
        torch.manual_seed(0)
        state = fit(network_of(config, n_features).build(), plan, progress=False)
        rates["rul"].append(sum(h["samples_per_s"] for h in state.history) / len(state.history))
    m, r = max(rates["minimal"]), max(rates["rul"])
    print(f"engine: rul {r:,.0f} samples/s vs minimal loop {m:,.0f} samples/s "
          f"-> ratio {r / m:.3f} (target >= 0.90; micro {config.micro_batch_size} x K "
          f"{config.accumulation_steps}, fp32 CPU, {torch.get_num_threads()} threads)")
    return _summary({"rul samples/s": round(r), "minimal loop samples/s": round(m),
                     "ratio": round(r / m, 3), "target": ">= 0.90"})


def bench_tracking():
    """The default `make train` config, tracked vs untracked (same seed: same epochs)."""
    from rul import config as cfg
    from rul.plan import plan_run
    from rul.training.checkpoint import Checkpointer
    from rul.training.run import train
    from rul.workflows.train import train_tracked

    with tempfile.TemporaryDirectory() as scratch:
        overrides = {"checkpoint_dir": f"{scratch}/ckpt",
                     "tracking_uri": f"sqlite:///{scratch}/mlflow.db", "register": True}
        config = cfg.load(DEFAULT, overrides)
        start = time.perf_counter()
        untracked = train(plan_run(config), progress=False,
                          checkpointer=Checkpointer(f"{scratch}/ckpt/untracked.pt"))
        plain = time.perf_counter() - start
        import os

        cwd = os.getcwd()
        os.chdir(scratch)
        try:
            from rul.tracking.store import open_store

            open_store(config)  # store creation: one-time, not per run
            start = time.perf_counter()
            outcome, _ = train_tracked(config, progress=False)
            tracked = time.perf_counter() - start
        finally:
            os.chdir(cwd)
    assert outcome.metrics == untracked.metrics  # the same training, only tracking differs
    epochs = outcome.state.epoch
    print(f"tracking: tracked {tracked:.1f}s vs untracked {plain:.1f}s for {epochs} epochs "
          f"-> overhead {100 * (tracked / plain - 1):.1f}% (target <= 5%; includes model "
          "logging, registration, figures, datasets)")
    return _summary({"tracked (s)": round(tracked, 1), "untracked (s)": round(plain, 1),
                     "overhead (%)": round(100 * (tracked / plain - 1), 1), "target (%)": "<= 5"})


def bench_accuracy():
    from rul import config as cfg
    from rul.plan import plan_run
    from rul.training.run import train

    config = cfg.load(DEFAULT)
    start = time.perf_counter()
    outcome = train(plan_run(config), progress=False)
    seconds = time.perf_counter() - start
    m = outcome.metrics
    print(f"accuracy: default config test RMSE {m['test_rmse']:.2f} (target <= 13.0), "
          f"uncapped {m['test_rmse_uncapped']:.2f}, score {m['test_score']:.1f}, best epoch "
          f"{m['best_epoch']}/{outcome.state.epoch}, {seconds:.0f}s wall (target <= 300 s)")
    return accuracy_result({"test RMSE": round(m["test_rmse"], 2),
                            "score": round(m["test_score"], 1), "best epoch": m["best_epoch"],
                            "wall time (s)": round(seconds),
                            "precision": outcome.plan.precision.name})


def accuracy_result(figures: dict) -> dict:
    """bench accuracy's figures as a table and as the summary the Performance page's
    `make train` by machine table reads (rul.reporting.pages.train_times)."""
    return {**_summary(figures), "summary": figures}


def bench_memory():
    from bench.memory import bench_memory as run

    return run(quick=QUICK)


def bench_speed():
    from bench.speed import bench_speed as run

    return run(quick=QUICK, compile_too=COMPILE)


MISTAKES = {  # what a user types wrong, and what `rul` must answer before torch and mlflow
    "unknown key (epoks=3)": ["train", str(DEFAULT), "epoks=3"],
    "bad value (model=foo)": ["train", str(DEFAULT), "model=foo"],
    "a 27-column row in the training file": None,  # a copy of FD001 with one row too long
    "a tuning key of the wrong type (n_trials=x)": ["tune", str(ROOT / "experiments" /
                                                             "tune_fd001.yaml"), "n_trials=x"],
}


def bench_mistakes():
    """Seconds from the command to its one-line error, three runs each (median), and the
    import time of `rul` itself (python -X importtime); no mistake may import torch."""
    import shutil
    import statistics

    data = Path(os.environ.get("CMAPSS_DIR", ROOT / "data" / "cmapss"))
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        bad = Path(scratch) / "cmapss"
        bad.mkdir()
        for name in ("train_FD001.txt", "test_FD001.txt", "RUL_FD001.txt"):
            shutil.copy(data / name, bad / name)
        lines = (bad / "train_FD001.txt").read_text().splitlines()
        lines[4] += " 1.0"
        (bad / "train_FD001.txt").write_text("\n".join(lines) + "\n")
        for what, args in MISTAKES.items():
            args = args or ["train", str(DEFAULT), f"data_dir={bad}"]
            times, said = [], ""
            for _ in range(3):
                started = time.perf_counter()
                done = subprocess.run([sys.executable, "-m", "rul", *args], cwd=scratch,
                                      capture_output=True, text=True)
                times.append(time.perf_counter() - started)
                said = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
            seconds = statistics.median(times)
            print(f"mistakes: {what}: {seconds:.2f} s (exit {done.returncode}) {said[:70]}")
            rows.append([what, f"{seconds:.2f} s", f"exit {done.returncode}", said[:90]])
    imported = subprocess.run([sys.executable, "-X", "importtime", "-c", "import rul.cli"],
                              capture_output=True, text=True).stderr.splitlines()
    total = next(int(line.split("|")[1]) for line in imported
                 if line.split("|")[-1].strip() == "rul.cli") / 1e6  # its cumulative us
    print(f"mistakes: import rul.cli {total:.2f} s (python -X importtime, cumulative)")
    rows.append(["import rul.cli (python -X importtime)", f"{total:.2f} s", "", ""])
    return {"columns": ["mistake", "time to the error (median of 3)", "exit", "the line"],
            "rows": rows}


def bench_split():
    """`make train`'s first epoch (dropout 0) as 512x1, 256x2 and 128x4 per optimizer and
    precision on this machine, by gpu-check's own check (bench/gpu_check.py check_splits)."""
    from bench.gpu_check import Check, check_splits
    from rul.data import load_subset
    from rul.training.optimizers import OPTIMIZER_KINDS

    subset = load_subset("FD001", os.environ.get("CMAPSS_DIR"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    check = Check()
    trained_as = []
    for kind in OPTIMIZER_KINDS:
        file, changes = optimizer_recipe(kind)
        check_splits(check, subset, dry=False,
                     changes={**changes, "optimizer": kind, "device": device})
        trained_as.append(f"{kind} as {file}")
    rows = [[r["what"], r["result"], r["promise"], "yes" if r["ok"] else "NO"]
            for r in check.rows]
    return {"columns": ["what", "measured", "promise", "holds"], "rows": rows,
            "summary": {"promises holding": f"{len(rows) - len(check.failed)} of {len(rows)}"},
            "note": f"the first epoch, dropout 0, seed 7, on {device}, each optimizer in its "
                    f"own recipe ({', '.join(trained_as)})"}


def optimizer_recipe(kind: str) -> tuple[str, dict]:
    """(file, keys) of the recipe that trains optimizer `kind`: make train's for its own; for
    another, the experiments/ file closest to it that trains `kind` at the same effective batch
    (its learning rate and network: another optimizer at Muon's rate is not a training anyone
    runs, and it amplifies the sums' rounding); epochs and patience left out."""
    from rul import config as cfg
    from rul.config.recipes import differences, recipe_files

    recipe = cfg.TrainConfig()
    if kind == recipe.optimizer:
        return "make train's recipe", {}
    ignored = {"epochs", "patience", "micro_batch_size", "accumulation_steps"}
    found = [(differences(c, recipe, ignored), path.name) for path in recipe_files()
             for c in [cfg.load(path)] if c.optimizer == kind and c.data is None
             and c.effective_batch_size == recipe.effective_batch_size]
    if not found:
        raise ValueError(f"no experiments/ recipe trains optimizer {kind} at make train's "
                         "effective batch")
    changes, name = min(found, key=lambda f: (len(f[0]), f[1]))
    return f"experiments/{name}", changes


def bench_lean():
    from bench.lean import bench_lean as lean

    return lean()


def bench_serving():
    from bench.serving import bench_serving as run

    return run(quick=QUICK)


def bench_members():
    from bench.members import bench_members as run

    return run(epochs=1 if QUICK else 3)


def bench_peers():
    from bench.peers.runner import bench_peers as run

    return run(epochs=EPOCHS, dry=DRY_RUN)


def _summary(values: dict) -> dict:
    """A bench whose result is a few named figures: one table of what and measured."""
    return {"columns": ["what", "measured"], "rows": [[k, v] for k, v in values.items()]}


def _git(*args) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def write_result(folder: Path, name: str, result: dict, argv: list[str],
                 program: str = "python -m bench") -> Path:
    """One bench's result as JSON, with where, when and how (`program` `argv`) it was
    measured."""
    from rul.machine import machine_tags

    now = datetime.now(timezone.utc)
    dirty = _git("status", "--porcelain")
    record = {"bench": name, "date": now.strftime("%Y-%m-%d %H:%M UTC"),
              "commit": _git("rev-parse", "--short", "HEAD") or "unknown",
              "dirty": None if dirty is None else bool(dirty),
              "command": " ".join([program, *argv]), "machine": machine_tags(),
              **result}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{now.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


QUICK = COMPILE = DRY_RUN = False
EPOCHS = 5  # bench peers


def _option(argv: list[str], flag: str, example: str) -> tuple[str | None, list[str]]:
    """The value after `flag` in `argv` (None without the flag), and argv without both."""
    if flag not in argv:
        return None, argv
    at = argv.index(flag)
    if at + 1 >= len(argv):
        sys.exit(f"{flag} needs a value, e.g. {flag} {example}")
    return argv[at + 1], argv[:at] + argv[at + 2:]


def main(argv):
    global QUICK, COMPILE, DRY_RUN, EPOCHS
    given = list(argv)
    folder, argv = _option(argv, "--json", "bench/results")
    json_dir = Path(folder) if folder is not None else None
    epochs, argv = _option(argv, "--epochs", "5")
    if epochs is not None:
        if not epochs.isdigit() or int(epochs) < 1:
            sys.exit(f"--epochs {epochs}: must be a whole number >= 1")
        EPOCHS = int(epochs)
    QUICK, COMPILE, DRY_RUN = "--quick" in argv, "--compile" in argv, "--dry-run" in argv
    argv = [a for a in argv if a not in ("--quick", "--compile", "--dry-run")]
    chosen = argv or ["data", "engine", "tracking", "memory", "speed"]
    benches = {"data": bench_data, "engine": bench_engine, "tracking": bench_tracking,
               "accuracy": bench_accuracy, "memory": bench_memory, "speed": bench_speed,
               "mistakes": bench_mistakes, "lean": bench_lean, "members": bench_members,
               "peers": bench_peers, "serving": bench_serving, "split": bench_split}
    unknown = [c for c in chosen if c not in benches]
    if unknown:
        sys.exit(f"unknown bench {unknown}; choose from {', '.join(benches)}")
    options = [a for a in given if a.startswith("--") and a not in ("--json", "--epochs")]
    if epochs is not None:
        options += ["--epochs", epochs]
    for name in chosen:
        result = benches[name]()
        if json_dir is not None:
            path = write_result(json_dir, name, result, [name, *options])
            print(f"wrote {path}")



if __name__ == "__main__":
    main(sys.argv[1:])
