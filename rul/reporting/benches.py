"""Bench results for the Performance page: the JSON files `python -m bench --json DIR` writes,
and the committed record of earlier measurements (docs/data/performance.yaml), in one form."""

import json
from dataclasses import dataclass, field
from pathlib import Path

from rul import config as cfg
from rul.reporting.records import NA, machine_text, read_yaml


@dataclass
class BenchResult:
    bench: str
    command: str
    machine: str
    torch: str
    commit: str
    date: str
    columns: list[str]
    rows: list[list]
    summary: dict = field(default_factory=dict)
    note: str = ""
    source: str = "recorded"


def _result(entry: dict, source: str) -> BenchResult:
    machine = entry.get("machine", NA)
    torch = entry.get("torch", NA)
    if isinstance(machine, dict):  # a bench's JSON: the tags of rul/machine.py
        torch = machine.get("torch_version", NA)
        machine = machine_text(machine)
    commit = str(entry.get("commit", NA))
    if entry.get("dirty"):
        commit += " + local changes"
    return BenchResult(bench=entry["bench"], command=entry.get("command", NA), machine=machine,
                       torch=str(torch), commit=commit, date=str(entry.get("date", NA)),
                       columns=list(entry["columns"]), rows=[list(r) for r in entry["rows"]],
                       summary=dict(entry.get("summary") or {}), note=entry.get("note", ""),
                       source=source)


def read_bench_folder(folder: Path) -> list[BenchResult]:
    """Every *.json a bench wrote in `folder`, newest first."""
    results = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            results.append(_result(json.loads(path.read_text()), f"{path.name}"))
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise cfg.ConfigError(f"{path}: not a bench result ({error})") from None
    return sorted(results, key=lambda r: r.date, reverse=True)


def read_recorded_benches(path: Path) -> tuple[list[BenchResult], list[dict]]:
    data = read_yaml(path)
    results = []
    for number, entry in enumerate(data.get("results", []), start=1):
        try:
            results.append(_result(entry, "recorded"))
        except (KeyError, TypeError) as error:
            raise cfg.ConfigError(f"{path}: result {number}: missing {error}") from None
    return results, list(data.get("decisions", []))
