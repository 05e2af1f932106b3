"""`python -m bench peers` in its dry-run size: rul's loop and the plain loop always run (each
in its own process), a peer that is not installed is skipped with one line, the figures are
ratios to the plain loop, every loop trains the same thing, and the result reaches the
Performance page."""

import importlib.util

import pytest

import bench.__main__ as bench_main
from bench.peers import runner
from bench.peers.common import bench_config
from rul.reporting.benches import read_bench_folder
from rul.reporting.pages import performance_page


def _loop(samples_per_s: float, wall_s: float, val_rmse: float = 20.0) -> dict:
    return {"samples_per_s": samples_per_s, "wall_s": wall_s, "val_rmse": val_rmse}


def test_figures_are_ratios_to_the_plain_loop_and_rul_meets_the_fastest_other():
    results = {"plain": _loop(1000, 10), "rul": _loop(1500, 8), "lightning": _loop(1200, 9),
               "accelerate": _loop(500, 20), "plain, rul's malloc": _loop(2000, 5)}
    rows = {row[0]: row for row in runner.rows_of(results)}
    assert rows["plain"][2] == 1.0 and rows["plain"][4] == 1.0
    assert rows["rul"][2] == 1.5 and rows["rul"][4] == 0.8
    assert rows["accelerate"][2] == 0.5 and rows["accelerate"][4] == 2.0
    # the plain loop with rul's malloc settings tells where rul's speed comes from; no peer
    assert runner.rul_vs_fastest_peer(results) == ("lightning", 1.25)


def _same_training(rows: dict) -> None:
    """Every loop's validation RMSE within 5 % of the plain loop's: the same network, data,
    batches and arithmetic (dropout's masks and the last short step differ)."""
    plain = rows["plain"][5]
    for loop, row in rows.items():
        assert abs(row[5] - plain) <= 0.05 * plain, (loop, row[5], plain)


def test_a_missing_peer_is_one_line_and_rul_and_plain_still_run(real_data_dir, tmp_path,
                                                                monkeypatch, capsys):
    monkeypatch.setenv("CMAPSS_DIR", str(real_data_dir))
    monkeypatch.setattr(runner, "missing", lambda loop: loop if loop in (
        "lightning", "accelerate") else None)
    bench_main.main(["peers", "--dry-run", "--json", str(tmp_path)])
    printed = capsys.readouterr().out.splitlines()
    for peer in ("lightning", "accelerate"):
        said = [line for line in printed if line.startswith(f"peers: {peer} skipped")]
        assert said == [f"peers: {peer} skipped: {peer} is not installed "
                        "(pip install -e '.[peers]')"]
    [result] = read_bench_folder(tmp_path)
    assert result.bench == "peers" and "--dry-run" in result.command
    rows = {row[0]: row for row in result.rows}
    assert list(rows) == ["plain", "rul", "plain, rul's malloc"]
    assert all(row[1] > 0 and row[3] > 0 for row in rows.values())
    _same_training(rows)
    assert result.summary["skipped"] == "lightning, accelerate"
    # the optimizer `make train`'s recipe steps, named: older results stepped AdamW
    assert result.summary["optimizer"] == bench_config(2, True, "cpu").optimizer == "muon"
    assert result.summary["rul vs the fastest peer (samples/s)"].endswith("(plain)")
    page = performance_page([result], [], "rul report")
    assert "## Against the loops a user would pick instead" in page and "| rul |" in page


@pytest.mark.skipif(not all(importlib.util.find_spec(p) for p in ("lightning", "accelerate")),
                    reason="the peers extra is not installed (pip install -e '.[peers]')")
def test_every_peer_trains_the_same_thing(real_data_dir, monkeypatch):
    monkeypatch.setenv("CMAPSS_DIR", str(real_data_dir))
    result = runner.bench_peers(dry=True)
    rows = {row[0]: row for row in result["rows"]}
    assert list(rows) == ["plain", "rul", "lightning", "accelerate", "plain, rul's malloc"]
    for loop in rows:  # each loop ran every epoch, its own way
        assert result["loops"][loop]["epochs"] == 2
    _same_training(rows)


def test_gpu_check_runs_the_peers_and_holds_rul_to_its_gpu_target(monkeypatch, capsys):
    from bench import gpu_check

    speeds = {"plain": 1000, "rul": 1400, "lightning": 900}  # a faster plain + malloc row
                                                              # is no peer: not the target's
    monkeypatch.setattr(runner, "missing", lambda loop: loop if loop == "accelerate" else None)
    monkeypatch.setattr(runner, "run_loops", lambda loops, epochs, dry: {
        loop: {**_loop(speeds.get(loop, 2000), 10), "device": "cuda", "precision": "bf16",
               "optimizer": "muon", "windows": 100} for loop in loops})
    check = gpu_check.Check()
    gpu_check.check_peers(check, dry=False)
    rows = {row["what"]: row for row in check.rows}
    assert rows["accelerate: skipped"]["ok"]
    target = rows["rul vs the fastest peer"]
    assert target["result"] == "1.40x samples/s (plain)" and not target["ok"]  # < 1.5x
    dry = gpu_check.Check()
    gpu_check.check_peers(dry, dry=True)
    assert not dry.failed  # a dry run on the CPU promises nothing about speed
