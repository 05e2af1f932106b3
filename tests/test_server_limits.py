"""What the server grants a client has one table (rul.serving.limits): its flags, their
environment variables and defaults, and the serve guide's table follow it."""

import argparse
import os
from pathlib import Path

import pytest

from rul.serving.admission import PEAK_PER_BYTE, SMALL_SHARE, largest_body
from rul.serving.limits import LIMITS, Limits, add_flags, from_args

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "guides" / "serve.md"
TABLE_START = "<!-- limits: generated from rul/serving/limits.py by tests/test_server_limits.py -->"
TABLE_END = "<!-- limits end -->"


def parse(argv, environ=None) -> Limits:
    parser = argparse.ArgumentParser()
    add_flags(parser, environ or {})
    return from_args(parser, parser.parse_args(argv))


def test_flags_and_environment_variables_set_each_limit():
    assert parse([]) == Limits()
    assert parse(["--memory-mb", "512", "--max-connections", "10"]) == Limits(
        memory_mb=512, max_connections=10)
    environ = {"RUL_SERVE_HEADER_TIMEOUT": "3", "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT": "30",
               "RUL_SERVE_MAX_BODY_MB": "8"}
    assert parse([], environ) == Limits(header_timeout=3, timeout=30, max_body_mb=8)
    assert parse(["--header-timeout", "4"], environ).header_timeout == 4  # the flag wins


@pytest.mark.parametrize("argv", [["--memory-mb", "0"], ["--min-rate-kb", "-1"]])
def test_a_limit_that_is_not_positive_is_one_line(argv, capsys):
    with pytest.raises(SystemExit):
        parse(argv)
    assert f"{argv[0]} must be positive" in capsys.readouterr().err


def test_the_body_limit_follows_from_the_memory_budget():
    """By default the largest body whose expected peak fits what large requests may take of
    the budget (all but the share kept for small ones)."""
    for memory_mb in (256, 1024, 4096):
        limits = Limits(memory_mb=memory_mb)
        worst = max(PEAK_PER_BYTE["json"], PEAK_PER_BYTE["csv"])
        large = limits.memory * (1 - SMALL_SHARE)
        assert limits.max_body == largest_body(limits.memory)
        assert limits.max_body * worst <= large < (limits.max_body + 1) * worst + 1
    assert Limits(max_body_mb=8).max_body == 8 * 2**20


def docs_table() -> str:
    lines = ["| limit | default | flag (`SERVE_ARGS=\"...\"`) | environment variable |",
             "| --- | --- | --- | --- |"]
    for limit in LIMITS:
        default = (f"{Limits().max_body / 2**20:.0f} MB with the default budget"
                   if limit.default is None else f"{limit.default:g} {limit.unit}")
        lines.append(f"| {limit.meaning} | {default} | `--{limit.name.replace('_', '-')}` | "
                     f"`{limit.env}` |")
    return "\n".join(lines)


def test_the_serve_guide_shows_the_table():
    """docs/guides/serve.md's table of limits is this one (RUL_WRITE_DOCS=1 rewrites it)."""
    text = DOC.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    if os.environ.get("RUL_WRITE_DOCS") == "1":
        DOC.write_text(text[:start] + "\n" + docs_table() + "\n" + text[end:])
    assert text[start:end].strip() == docs_table(), "serve.md's limits: RUL_WRITE_DOCS=1"
