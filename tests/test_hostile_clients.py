"""The served model under hostile clients, end to end, on 127.0.0.1 only, bounded in count and
time (bench/serving.py's `hostile`, which `python -m bench serving` runs with the default
network for the Performance page): 1,000 slow connections (headers never finished, a 500 MB
body at a trickle, a chunked body with no end) opened, the first request after them answered,
then held open while one-engine requests are timed;
four maximal bodies sent at once within the memory budget while they are timed again; every
thing clients were seen to do wrong answered with its status and one line; the server up
afterwards, its stderr under 100 lines."""

import resource
import statistics
from pathlib import Path

import pytest
from test_inference import tiny_model_folder
from test_intervals import banded_interval

from bench.serving import Server, hostile, percentile

pytestmark = pytest.mark.slow

SLOW = 1000
MEMORY_MB = 256  # a small budget: maximal bodies of ~14 MB, quick to send and predict
HEADER_TIMEOUT = 5  # longer than the timing window: the slow connections are held through it
WINDOW_S = 3
P95_MS = 250  # one-engine requests, with slow connections open or a maximal body in flight
# p95, not p99: a 3 s window holds about 100 requests on a 2-core CI machine whose other test
# worker trains beside it, so its p99 is its slowest request, one scheduling hiccup (636 ms
# once, 43 ms quiet); a server that stalls on slow clients or a body fails p95 as plainly.
Q = 0.95
STDERR_LINES = 100

EXPECTED = {  # what: (status, the answer's line starts with)
    "engines 2**70 and 2**71 (once merged)":
        (400, "input: row 1: unit is not a positive whole number below 2**63"),
    "a uint64 unit of 2**64 - 1 in Parquet":
        (400, "input: row 32: unit is not a positive whole number below 2**63"),
    "a sensor at 1e9 (once NaN in a 200)": (200, "2 predictions, p_fail_within null for unit 2"),
    "a script in the Content-Type": (415, "headers: Content-Type must be application/json, "
                                          "text/csv or application/vnd.apache.parquet"),
    "invalid UTF-8 in a CSV": (400, "body: a CSV must be UTF-8 text"),
    "a column name of 765 characters": (400, "input: missing columns ['s_21'] (found instead "
                                             "['ssssssssssss...'])"),
    "a parameter name of 765 characters": (400, f"unknown parameter '{'p' * 36}...; allowed: "),
    "JSON nested 10,000 deep": (400, "body: JSON nested too deeply"),
    "no Content-Type": (400, "headers: Content-Type is missing"),
    "GET /invocations": (405, "method: /invocations takes POST"),
    "HEAD /invocations": (405, "(no body: HEAD)"),
    "OPTIONS /invocations": (405, "method: /invocations takes POST"),
    "TRACE /invocations": (405, "method: /invocations takes POST"),
    "a Parquet body": (200, "2 predictions"),
    "/docs": (404, "path: not found"),
    "/openapi.json": (404, "path: not found"),
    "/invocations/ with a Host of evil.example": (404, "path: not found"),
    "units 2**60 and 2**60 + 1 beside a 5.0 (once merged)":
        (400, "input: row 2: unit is 2**53 or more in a column read as decimals"),
    "a gzip body": (400, "body: gzip-compressed; send the JSON uncompressed"),
    "Content-Encoding: gzip": (415, "headers: Content-Encoding is not accepted"),
    "Expect: 100-continue with a Content-Length of 10**15":
        (413, "body: larger than this server's limit of"),
    "a chunk size that is not hexadecimal": (400, "request: not valid HTTP/1.1"),
}
COSTLY = {  # what: its status, alone
    "MB of empty JSON objects": 413,  # what its containers take: more than the budget
    "a Parquet list cell of 50M zeros in a column the model does not read": 200,
    "30,000 Parquet columns": 200,
    "20,000 one-row engines in a CSV": 413,  # more engines than 1.1 MB pays for
    "4,000 engines of 50 rows in a CSV": 200,
}


@pytest.fixture(scope="module")
def served(tmp_path_factory, fd001):
    root = tmp_path_factory.mktemp("hostile")
    folder = tiny_model_folder(fd001, root, interval=banded_interval())
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4 * SLOW:  # this process holds the slow connections' other ends
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4 * SLOW, hard), hard))
    server = Server(folder, ["--memory-mb", MEMORY_MB, "--header-timeout", HEADER_TIMEOUT])
    server.start(root)
    try:
        yield server, hostile(server, fd001.test, slow=SLOW, seconds=WINDOW_S, bodies=4,
                              header_timeout=HEADER_TIMEOUT)
    finally:
        server.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_slow_connections_are_cut_off_and_valid_clients_keep_their_latency(served):
    _, found = served
    for kind, statuses in found["slow"].items():
        assert statuses == {"408": SLOW // 3 + (kind == "headers never finished")}, (kind,
                                                                                     statuses)
    status, first_ms = found["taking_in"]  # queued behind the server taking them in: answered
    assert status == 200 and first_ms < 1000 * HEADER_TIMEOUT, found["taking_in"]
    alone, loaded = found["alone"], found["with_slow"]
    assert len(loaded) >= 20, len(loaded)
    assert percentile(loaded, Q) <= max(P95_MS, 2 * percentile(alone, Q)), (
        statistics.median(alone), percentile(alone, Q), percentile(loaded, Q),
        percentile(loaded, 0.99))


def test_maximal_bodies_at_once_stay_within_the_memory_budget(served):
    _, found = served
    statuses = sorted(status for status, _ in found["bodies"])
    assert 200 in statuses and set(statuses) <= {200, 503}, statuses
    assert all(headers.get("retry-after") == "2" for status, headers in found["bodies"]
               if status == 503)
    assert found["peak_mb"] <= found["budget_mb"], (found["peak_mb"], found["body_mb"])
    loaded = found["with_bodies"]
    assert len(loaded) >= 20 and percentile(loaded, Q) <= P95_MS, (
        statistics.median(loaded), percentile(loaded, Q), percentile(loaded, 0.99))


def test_a_large_body_is_worked_on_by_the_worker_not_the_server_s_process(served):
    """Above 1 MiB a body is parsed and predicted in the worker process: its GIL is not the
    event loop's (the p99s above hold with it; in the server's process a maximal body's
    json.loads alone holds the GIL for a second)."""
    _, found = served
    lanes = found["lanes"]
    assert lanes["status"] == 200
    assert lanes["others_s"] > 0.2 and lanes["server_s"] < lanes["others_s"] / 3, lanes


def test_every_case_of_the_list_is_its_status_and_one_line(served):
    _, found = served
    answered = {what: (status, line) for what, status, line in found["list"]}
    assert set(answered) == set(EXPECTED)
    for what, (status, start) in EXPECTED.items():
        got_status, line = answered[what]
        assert got_status == status and line.startswith(start), (what, answered[what])
        assert "\n" not in line and len(line) <= 200 and "script" not in line, what
        assert "[Location!]" not in line and "\\x" not in line, what


def test_bodies_that_cost_more_than_their_bytes_stay_within_the_budget(served):
    """Each alone: refused by what it would take, or answered within the memory budget (a
    list cell of 50M zeros once took 1.65 GB, 100,000 columns 1 GB, empty objects 37x their
    bytes)."""
    _, found = served
    measured = {what: (status, peak) for what, status, peak in found["costly"]}
    assert len(measured) == len(COSTLY), measured
    for what, status in COSTLY.items():
        (got, peak), = [value for name, value in measured.items() if name.endswith(what)]
        assert got == status and peak <= found["budget_mb"], (what, got, peak)


def test_the_server_is_up_afterwards_and_its_stderr_short(served, capsys):
    server, found = served
    assert found["alive"]
    lines = found["stderr"]
    assert len(lines) < STDERR_LINES, "\n".join(lines[-30:])
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    assert Path(server.log).is_file()
    with capsys.disabled():  # the figures, for whoever reads the run
        print(f"\nhostile clients: one engine p50/p99 alone "
              f"{statistics.median(found['alone']):.0f}/{percentile(found['alone'], 0.99):.0f} ms,"
              f" the first after {SLOW} slow connections opened {found['taking_in'][1]:.0f} ms,"
              f" with them held {percentile(found['with_slow'], 0.99):.0f} ms p99, "
              f"with {len(found['bodies'])} bodies of {found['body_mb']:.1f} MB "
              f"{percentile(found['with_bodies'], 0.99):.0f} ms p99; bodies answered "
              f"{sorted(s for s, _ in found['bodies'])}, peak {found['peak_mb']:.0f} MB of a "
              f"{found['budget_mb']:g} MB budget; slow connections {found['slow']}; "
              f"costly bodies alone " + ", ".join(f"{what}: {status}, {peak:.0f} MB"
                                                  for what, status, peak in found["costly"])
              + f"; stderr {len(lines)} lines")
