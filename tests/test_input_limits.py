"""Every file rul reads is checked before a byte of it is read: a regular file (a named pipe
or a folder is named as such, not "file not found"), within its size limit (a config 1 MB,
a data file `max_data_mb`, `rul predict --input` `--max-input-mb`), else one line, exit 2,
nothing started. Sparse files stand in for large ones: refusing them must take no time."""

import os
import time

import pytest
from click.testing import CliRunner

from rul.cli import main
from rul.files import INPUT_LIMIT, SizeLimit, refusal

TINY = ["epochs=1", "window=20", "filters=4", "num_layers=2", "hidden_size=8",
        "micro_batch_size=64", "accumulation_steps=1", "register=false"]


def sparse(path, megabytes: float):
    with open(path, "wb") as file:
        file.truncate(int(megabytes * 2**20))
    return path


def test_the_refusal_names_the_size_the_limit_and_the_knob(tmp_path):
    assert refusal(sparse(tmp_path / "big.csv", 300), INPUT_LIMIT) == (
        "300.0 MB is over the limit of 256 MB (raise it with --max-input-mb)")
    assert refusal(sparse(tmp_path / "ok.csv", 1), INPUT_LIMIT) is None
    assert refusal(tmp_path / "missing.csv") == "file not found"
    assert refusal(tmp_path).startswith("not a regular file (a folder)")
    assert SizeLimit(1).refusal(3 * 2**20) == "3.0 MB is over the limit of 1 MB"


def test_predict_refuses_a_large_input_unread_and_a_pipe_by_its_name(tmp_path):
    big = sparse(tmp_path / "rows.csv", 1024)  # what cost 110 s and 11.9 GB to refuse
    started = time.perf_counter()
    result = CliRunner().invoke(main, ["predict", "--model", "models:/none@champion",
                                       "--input", str(big)])
    assert time.perf_counter() - started < 5
    assert result.exit_code == 2, result.output
    assert result.stderr == (f"Error: {big}: 1.0 GB is over the limit of 256 MB (raise it "
                             "with --max-input-mb)\n")

    small = sparse(tmp_path / "test.txt", 0.5)
    result = CliRunner().invoke(main, ["predict", "--model", "models:/none@champion",
                                       "--input", str(small), "--max-input-mb", "0.25"])
    assert result.exit_code == 2
    assert "512.0 KB is over the limit of 0.25 MB" in result.stderr

    pipe = tmp_path / "rows.txt"
    os.mkfifo(pipe)
    result = CliRunner().invoke(main, ["predict", "--model", "models:/none@champion",
                                       "--input", str(pipe)])
    assert result.exit_code == 2
    assert result.stderr == (f"Error: {pipe}: not a regular file (a named pipe); give a file, "
                             "a copy if need be\n")


def test_training_refuses_a_data_file_over_max_data_mb_before_anything_starts(
        write_cmapss, tmp_path, monkeypatch):
    data = write_cmapss()
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["train", *TINY, f"data_dir={data}",
                                       "max_data_mb=0.001"])
    assert result.exit_code == 2, result.output
    train = data / "train_FD001.txt"
    assert result.stderr.startswith(f"Error: {train}: ")
    assert result.stderr.endswith(" is over the limit of 0.001 MB (raise it with max_data_mb)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmapss"]  # no store, no run


@pytest.mark.parametrize("kind", ["large", "pipe"])
def test_a_config_file_must_be_a_small_regular_file(tmp_path, monkeypatch, kind):
    config = tmp_path / "big.yaml"
    if kind == "large":
        sparse(config, 2)
    else:
        os.mkfifo(config)  # reading it would wait forever for a writer
    result = CliRunner().invoke(main, ["train", str(config)])
    assert result.exit_code == 2, result.output
    said = ("2.0 MB is over the limit of 1 MB" if kind == "large"
            else "not a regular file (a named pipe)")
    assert result.stderr.startswith(f"Error: {config}: {said}")
    assert result.stderr.count("\n") == 1
