"""`make gpu-check` without a GPU: its dry run on the CPU (tiny sizes, 30 engines) checks
promises, fails on a broken one, and writes a result `rul report` puts on the Performance
page."""

from bench import gpu_check
from rul.reporting.benches import read_bench_folder
from rul.reporting.pages import performance_page


def test_the_dry_run_checks_its_promises_and_reports_a_broken_one(real_data_dir, tmp_path,
                                                                  monkeypatch, capsys):
    monkeypatch.setenv("CMAPSS_DIR", str(real_data_dir))
    monkeypatch.setitem(gpu_check.LOSS_BOUND, "bf16", 0.0)  # a promise that cannot hold
    code = gpu_check.main(["--only", "split", "resume", "--json", str(tmp_path)])
    printed = capsys.readouterr().out
    assert code == 1
    assert "DRY RUN on the CPU" in printed
    failed = [line for line in printed.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and "bf16: per-step loss vs 512x1" in failed[0]
    assert "fp16: skipped steps" in printed and "bit for bit" in printed
    [result] = read_bench_folder(tmp_path)
    assert result.bench == "gpu-check" and result.command.startswith("make gpu-check")
    assert result.summary["promises holding"] == f"{len(result.rows) - 1} of {len(result.rows)}"
    page = performance_page([result], [], "rul report")
    assert "## The GPU path" in page and "| split | bf16: per-step loss vs 512x1 |" in page
