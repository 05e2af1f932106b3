"""`make gpu-check` without a GPU: its dry run on the CPU (tiny sizes, 30 engines) checks
promises, fails on a broken one, and writes a result `rul report` puts on the Performance
page."""

from pathlib import Path

from bench import gpu_check
from rul.reporting.benches import read_bench_folder
from rul.reporting.pages import performance_page


def test_the_dry_run_checks_its_promises_and_reports_a_broken_one(real_data_dir, tmp_path,
                                                                  monkeypatch, capsys):
    monkeypatch.setenv("CMAPSS_DIR", str(real_data_dir))
    equal = gpu_check.weights_equal
    calls = []

    def second_differs(a, b):  # the rerun's promise cannot hold
        calls.append(1)
        return equal(a, b) and len(calls) != 2

    monkeypatch.setattr(gpu_check, "weights_equal", second_differs)
    code = gpu_check.main(["--only", "resume", "rerun", "--json", str(tmp_path)])
    printed = capsys.readouterr().out
    assert code == 1
    assert "DRY RUN on the CPU" in printed
    failed = [line for line in printed.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and "deterministic, twice" in failed[0]
    assert "ok  resume  fp16, stopped after epoch 2        bit for bit" in printed
    [result] = read_bench_folder(tmp_path)
    assert result.bench == "gpu-check" and result.command.startswith("make gpu-check")
    assert result.summary["promises holding"] == f"{len(result.rows) - 1} of {len(result.rows)}"
    page = performance_page([result], [], "rul report")
    assert "## The GPU path" in page and "| rerun |" in page and "| NO |" in page


def test_bench_split_trains_each_optimizer_in_its_own_recipe():
    """AdamW at its own rate and network, not swapped into Muon's (which amplifies even fp32's
    rounding): the experiments/ file that trains it at make train's effective batch."""
    from bench.__main__ import optimizer_recipe
    from rul import config as cfg

    assert optimizer_recipe("muon") == ("make train's recipe", {})
    file, changes = optimizer_recipe("adamw")
    recipe = cfg.load(Path(__file__).resolve().parents[1] / file)
    assert recipe.optimizer == "adamw" and changes["lr"] == recipe.lr != cfg.TrainConfig().lr
    assert recipe.effective_batch_size == cfg.TrainConfig().effective_batch_size
