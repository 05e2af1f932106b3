"""`python -m bench serving`: the served model under hostile clients, measured.

Trains the default recipe for one epoch into a scratch store (the default network's size; its
accuracy does not matter here), serves it as `make serve` does (`python -m rul.serving.server`
on 127.0.0.1) and measures:
- memory: the peak of the server's processes (the server and its worker) above their idle
  size, for the worst body of each format (every value one digit: the most rows per byte) and
  for FD001's own rows, divided by the body's size (a Parquet body: by the size it decodes
  to); rul.serving.admission's ratios come from the worst bodies;
- latency: one-engine requests (FD001 test unit 1) back to back, p50 and p99, alone and with
  one maximal body in flight the whole time;
- hostile clients (`hostile`, also the end-to-end test tests/test_hostile_clients.py, with
  smaller counts): slow connections held open while valid clients are timed, maximal bodies
  sent at once (how many admitted, how many 503, the peak memory against the budget), and each
  case of the list of things clients do wrong, answered with its status in one line.

Everything runs against 127.0.0.1 only, bounded in count and time.
"""

import contextlib
import gzip
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MB = 2**20
COLUMNS = ["unit", "cycle", "setting_1", "setting_2", "setting_3",
           *[f"s_{i}" for i in range(1, 22)]]
CONTENT_TYPES = {"json": "application/json", "csv": "text/csv",
                 "parquet": "application/vnd.apache.parquet"}


# ------------------------------------------------------------------ the server and its processes

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _status(pid: int, key: str) -> int:
    """A /proc/<pid>/status figure in bytes (VmRSS, VmHWM); 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (the server, its fork server, its worker)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


@dataclass
class Server:
    """`python -m rul.serving.server` on 127.0.0.1, its stderr in a file."""
    model: str
    args: list = field(default_factory=list)
    env: dict | None = None
    port: int = 0
    process: subprocess.Popen | None = None
    log: Path | None = None

    def start(self, folder: Path, seconds: float = 180) -> "Server":
        self.port = self.port or free_port()
        self.log = folder / f"serve-{self.port}.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rul.serving.server", self.model, "--port",
                 str(self.port), *map(str, self.args)],
                stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        deadline = time.monotonic() + seconds
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited: {self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.base}/ping", timeout=2):
                    return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not answer within {seconds} s") from None
                time.sleep(0.5)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def pids(self) -> list[int]:
        return descendants(self.process.pid)

    def resident(self) -> int:
        return sum(_status(pid, "VmRSS") for pid in self.pids())

    def reset_peaks(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(OSError):
                Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM back to VmRSS

    def cpu_seconds(self) -> dict[int, float]:
        """Each process's CPU time so far (user and system), by process id."""
        tick = os.sysconf("SC_CLK_TCK")
        seconds = {}
        for pid in self.pids():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                seconds[pid] = (int(fields[11]) + int(fields[12])) / tick
        return seconds

    def peak(self) -> int:
        return sum(_status(pid, "VmHWM") for pid in self.pids())

    def stderr_lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()


def post(base: str, body: bytes, media: str = "json", timeout: float = 120,
         headers: dict | None = None) -> tuple[int, bytes, dict]:
    """(status, body, headers) of POST /invocations."""
    request = urllib.request.Request(
        f"{base}/invocations", data=body,
        headers={"Content-Type": CONTENT_TYPES.get(media, media), **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


# ------------------------------------------------------------------ bodies

def worst_rows(size: int, media: str, cycles: int = 200):
    """A frame of about `size` bytes in `media` with the most rows per byte a valid body can
    have: engines of `cycles` cycles (0: one engine), every setting and sensor 0 (a Parquet
    file: `size` bytes decoded, rows x 26 x 8)."""
    import numpy as np
    import pandas as pd

    rows = size // (26 * 8) if media == "parquet" else size // 54
    cycles = cycles or rows
    values = np.zeros((rows, 26), dtype=np.int64)
    values[:, 0] = np.arange(rows) // cycles + 1
    values[:, 1] = np.arange(rows) % cycles + 1
    return pd.DataFrame(values, columns=COLUMNS)


def fd001_rows(size: int, media: str, test):
    """FD001's test rows repeated (engines renumbered) to about `size` bytes in `media`."""
    import pandas as pd

    per_row = 60 * 8 // 2 if media == "parquet" else 150
    rows = max(1, size // per_row)
    copies = rows // len(test) + 1
    frames = [test.assign(unit=test["unit"] + 100 * k) for k in range(copies)]
    return pd.concat(frames, ignore_index=True).head(rows)


def worst_body(size: int, media: str = "json") -> bytes:
    """The worst body (worst_rows) of `media`, as large as fits in `size` bytes."""
    frame = worst_rows(size, media)
    body = encode(frame, media)
    while len(body) > size:
        frame = frame.head(int(len(frame) * size / len(body) * 0.995))
        body = encode(frame, media)
    return body


def encode(frame, media: str) -> bytes:
    if media == "json":
        data = frame.to_numpy().tolist()
        return json.dumps({"dataframe_split": {"columns": list(frame.columns),
                                               "data": data}}, separators=(",", ":")).encode()
    if media == "csv":
        return frame.to_csv(index=False).encode()
    return frame.to_parquet()


def decoded(frame) -> int:
    return frame.shape[0] * frame.shape[1] * 8


# ------------------------------------------------------------------ measures

def peak_of(server: Server, body: bytes, media: str) -> tuple[int, int, float]:
    """(status, the peak above the idle size in bytes, seconds) of one request."""
    time.sleep(0.5)
    base = server.resident()
    server.reset_peaks()
    started = time.perf_counter()
    status, _, _ = post(server.base, body, media, timeout=600)
    seconds = time.perf_counter() - started
    return status, max(0, server.peak() - base), seconds


def memory_rows(server: Server, size: int, test) -> list[list]:
    """Peak per body byte for each format, the worst body and FD001's rows."""
    rows = []
    for media in ("json", "csv", "parquet"):
        for kind, frame in (("worst", worst_rows(size, media)),
                            ("worst, one engine", worst_rows(size, media, cycles=0)),
                            ("FD001 rows", fd001_rows(size, media, test))):
            body = encode(frame, media)
            del_size = decoded(frame) if media == "parquet" else len(body)
            status, peak, seconds = peak_of(server, body, media)
            per = "decoded " if media == "parquet" else ""
            rows.append([media, kind, f"{len(body) / MB:.1f} MB" + (
                f" ({del_size / MB:.0f} MB decoded)" if media == "parquet" else ""),
                status, f"{peak / MB:,.0f} MB", f"{peak / del_size:.1f} per {per}byte",
                f"{seconds:.1f} s"])
            print("serving memory:", *rows[-1])
    return rows


def one_engine(test) -> bytes:
    rows = test[test["unit"] == 1]
    return encode(rows, "json")


def latencies(base: str, body: bytes, seconds: float, stop: threading.Event | None = None
              ) -> list[float]:
    """Milliseconds of one-engine requests sent back to back for `seconds`."""
    times, ends = [], time.monotonic() + seconds
    while time.monotonic() < ends and not (stop and stop.is_set()):
        started = time.perf_counter()
        status, _, _ = post(base, body)
        times.append(1000 * (time.perf_counter() - started))
        assert status == 200, status
    return times


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def busy_with(base: str, body: bytes, media: str, stop: threading.Event, done: list) -> None:
    """Send `body` again and again until `stop` (the statuses in `done`)."""
    while not stop.is_set():
        done.append(post(base, body, media, timeout=600)[0])


def latency_rows(server: Server, test, big: bytes) -> list[list]:
    small = one_engine(test)
    latencies(server.base, small, 2)  # warm-up
    alone = latencies(server.base, small, 10)
    stop, statuses = threading.Event(), []
    worker = threading.Thread(target=busy_with, args=(server.base, big, "json", stop, statuses))
    worker.start()
    time.sleep(1.0)
    loaded = latencies(server.base, small, 20)
    stop.set()
    worker.join()
    everything = encode(test, "json")
    hundred = [1000 * _timed(lambda: post(server.base, everything)) for _ in range(10)]
    rows = [["one engine, alone", len(alone), f"{statistics.median(alone):.0f} ms",
             f"{percentile(alone, 0.99):.0f} ms"],
            [f"one engine, a {len(big) / MB:.0f} MB JSON body in flight "
             f"({len(statuses)} answered: {sorted(set(statuses))})", len(loaded),
             f"{statistics.median(loaded):.0f} ms", f"{percentile(loaded, 0.99):.0f} ms"],
            ["100 engines (13,096 rows)", len(hundred), f"{statistics.median(hundred):.0f} ms",
             f"{percentile(hundred, 0.99):.0f} ms"]]
    for row in rows:
        print("serving latency:", *row)
    return rows


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


# ------------------------------------------------------------------ hostile clients

SLOW_KINDS = {  # what a slow client sends, then nothing more
    "headers never finished": b"POST /invocations HTTP/1.1\r\nHost: x\r\nX-Slow: ",
    "a 500 MB body at a trickle": b"POST /invocations HTTP/1.1\r\nHost: x\r\n"
                                  b"Content-Type: application/json\r\n"
                                  b"Content-Length: 500000000\r\n\r\n{",
    "a chunked body with no end": b"POST /invocations HTTP/1.1\r\nHost: x\r\n"
                                  b"Content-Type: text/csv\r\n"
                                  b"Transfer-Encoding: chunked\r\n\r\n1\r\nu\r\n",
}


def open_slow(port: int, count: int) -> list[tuple[str, socket.socket]]:
    """`count` connections, the kinds of SLOW_KINDS in turn, each sent its start only."""
    opened = []
    kinds = list(SLOW_KINDS.items())
    for i in range(count):
        kind, start = kinds[i % len(kinds)]
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(start)
        sock.setblocking(False)
        opened.append((kind, sock))
    return opened


def statuses_of(opened: list[tuple[str, socket.socket]], seconds: float) -> dict:
    """What the server answered each slow connection before it closed it, within `seconds`:
    {kind: {status: count}} ('open' for one still open, 'closed' for none)."""
    import selectors

    selector = selectors.DefaultSelector()
    got = {}
    for kind, sock in opened:
        selector.register(sock, selectors.EVENT_READ, kind)
        got[sock] = b""
    counts: dict = {kind: {} for kind in SLOW_KINDS}
    ends = time.monotonic() + seconds
    while got and time.monotonic() < ends:
        for key, _ in selector.select(timeout=0.2):
            sock = key.fileobj
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, BlockingIOError):
                chunk = b""
            if chunk:
                got[sock] += chunk
                continue
            data = got.pop(sock)
            status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "closed"
            counts[key.data][status] = counts[key.data].get(status, 0) + 1
            selector.unregister(sock)
            sock.close()
    for sock in got:
        kind = selector.get_key(sock).data
        counts[kind]["open"] = counts[kind].get("open", 0) + 1
        sock.close()
    selector.close()
    return counts


def at_once(base: str, bodies: list[tuple[bytes, str]]) -> list[tuple[int, dict]]:
    """Send the bodies together (a thread each): (status, headers) of each."""
    results: list = [None] * len(bodies)

    def send(i, body, media):
        status, _, headers = post(base, body, media, timeout=600)
        results[i] = (status, {k.lower(): v for k, v in headers.items()})

    threads = [threading.Thread(target=send, args=(i, *b)) for i, b in enumerate(bodies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def raw(port: int, method: str, path: str, headers: dict | None = None,
        body: bytes | None = None) -> tuple[int, dict, bytes]:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def raw_head(port: int, request: bytes) -> tuple[int, dict, bytes]:
    """What the server answers to `request` (bytes as sent, no body after them) before it
    closes: no body is sent, so an answer that waits for one never comes (a timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), headers, body


def _one_float(frame):
    """The frame as a client writes it with one unit as a float (5.0): its JSON column is
    read as floats."""
    frame = frame.copy()
    frame.loc[frame.index[0], "unit"] = 5.0
    return frame


def costly(server: Server, limits: dict) -> list[tuple[str, int, float]]:
    """Bodies that cost more than their bytes say, each alone: (what, status, the peak of the
    server's processes above their idle size, MB)."""
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    def parquet(table) -> bytes:
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="zstd")
        return sink.getvalue()

    rows = worst_rows(20_000 * 54, "csv", cycles=1)  # one row per engine
    fifty = worst_rows(200_000 * 54, "csv", cycles=50)
    base = pa.Table.from_pandas(rows.head(3), preserve_index=False)
    listed = base.append_column("junk", pa.array(
        [np.zeros(50_000_000), np.zeros(0), np.zeros(0)], type=pa.list_(pa.float64())))
    wide = pa.table({**{c: base[c] for c in base.column_names},
                     **{f"x{i}": pa.array([0.0] * 3) for i in range(30_000)}})
    records = b'{"dataframe_records": [' + b",".join(
        [b"{}"] * ((limits["max_body"] - 30) // 3)) + b"]}"
    bodies = {
        f"{len(records) / MB:.0f} MB of empty JSON objects": (records, "json"),
        "a Parquet list cell of 50M zeros in a column the model does not read":
            (parquet(listed), "parquet"),
        "30,000 Parquet columns": (parquet(wide), "parquet"),
        "20,000 one-row engines in a CSV": (encode(rows, "csv"), "csv"),
        "4,000 engines of 50 rows in a CSV": (encode(fifty, "csv"), "csv"),
    }
    measured = []
    for what, (body, media) in bodies.items():
        status, peak, _ = peak_of(server, body, media)
        measured.append((what, status, peak / MB))
    return measured


def the_list(server: Server, test) -> list[tuple[str, int, str]]:
    """Each thing clients were seen to do wrong, sent once: (what, status, the answer's line
    or what it held)."""
    rows = test[test["unit"].isin([1, 2])].reset_index(drop=True)
    merged = rows.astype({"unit": object})
    merged["unit"] = merged["unit"].map({1: 2**70, 2: 2**71})
    glitch = rows.copy()
    glitch.loc[glitch.index[glitch["unit"] == 2][3], "s_9"] = 1e9
    long_name = rows.rename(columns={"s_21": "s" * 765})
    json_type = {"Content-Type": "application/json"}
    ok = encode(rows, "json")
    port = server.port
    cases = {
        "engines 2**70 and 2**71 (once merged)": lambda: raw(port, "POST", "/invocations",
                                                            json_type, encode(merged, "json")),
        "a uint64 unit of 2**64 - 1 in Parquet": lambda: raw(
            port, "POST", "/invocations", {"Content-Type": CONTENT_TYPES["parquet"]},
            merged.assign(unit=merged["unit"].map({2**70: 1, 2**71: 2**64 - 1}))
            .astype({"unit": "uint64"}).to_parquet()),
        "a sensor at 1e9 (once NaN in a 200)": lambda: raw(port, "POST", "/invocations",
                                                          json_type, encode(glitch, "json")),
        "a script in the Content-Type": lambda: raw(
            port, "POST", "/invocations", {"Content-Type": "text/<script>alert(1)</script>"},
            ok),
        "invalid UTF-8 in a CSV": lambda: raw(port, "POST", "/invocations",
                                              {"Content-Type": "text/csv"},
                                              b"unit,cycle\n1,\xff\xfe<b>\n"),
        "a column name of 765 characters": lambda: raw(port, "POST", "/invocations",
                                                       json_type, encode(long_name, "json")),
        "a parameter name of 765 characters": lambda: raw(
            port, "POST", "/invocations", json_type,
            json.dumps({**json.loads(ok), "params": {"p" * 765: 1}}).encode()),
        "JSON nested 10,000 deep": lambda: raw(port, "POST", "/invocations", json_type,
                                               b"[" * 10_000 + b"]" * 10_000),
        "no Content-Type": lambda: raw(port, "POST", "/invocations", {}, ok),
        "GET /invocations": lambda: raw(port, "GET", "/invocations"),
        "HEAD /invocations": lambda: raw(port, "HEAD", "/invocations"),
        "OPTIONS /invocations": lambda: raw(port, "OPTIONS", "/invocations"),
        "TRACE /invocations": lambda: raw(port, "TRACE", "/invocations"),
        "a Parquet body": lambda: raw(port, "POST", "/invocations",
                                      {"Content-Type": CONTENT_TYPES["parquet"]},
                                      rows.to_parquet()),
        "/docs": lambda: raw(port, "GET", "/docs"),
        "/openapi.json": lambda: raw(port, "GET", "/openapi.json"),
        "/invocations/ with a Host of evil.example": lambda: raw(
            port, "POST", "/invocations/", {"Host": "evil.example", **json_type}, ok),
        "units 2**60 and 2**60 + 1 beside a 5.0 (once merged)": lambda: raw(
            port, "POST", "/invocations", json_type, encode(rows.astype({"unit": object})
                                                            .assign(unit=rows["unit"].map(
                                                                {1: 2**60, 2: 2**60 + 1}))
                                                            .pipe(_one_float), "json")),
        "a gzip body": lambda: raw(port, "POST", "/invocations", json_type,
                                   gzip.compress(ok)),
        "Content-Encoding: gzip": lambda: raw(
            port, "POST", "/invocations", {**json_type, "Content-Encoding": "gzip"},
            gzip.compress(ok)),
        "Expect: 100-continue with a Content-Length of 10**15": lambda: raw_head(
            port, b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: 1000000000000000\r\nExpect: 100-continue\r\n\r\n"),
        "a chunk size that is not hexadecimal": lambda: raw_head(
            port, b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
    }
    said = []
    for what, call in cases.items():
        status, headers, body = call()
        if status == 200:
            answer = strict_json(body)["predictions"]
            line = f"{len(answer)} predictions" + (
                ", p_fail_within null for unit " + ", ".join(
                    str(p["unit"]) for p in answer if p.get("p_fail_within", 0) is None)
                if any(p.get("p_fail_within", 0) is None for p in answer) else "")
        elif not body:
            line = "(no body: HEAD)"
        else:
            line = strict_json(body)["message"]
        if any(k.lower() == "location" for k in headers):
            line += " [Location!]"
        said.append((what, status, line))
    return said


def strict_json(text: bytes):
    """json.loads that refuses NaN and Infinity, as JavaScript's JSON.parse does."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def hostile(server: Server, test, slow: int, seconds: float, bodies: int,
            header_timeout: float) -> dict:
    """The hostile-client run against a started server (its memory budget `budget` MB):
    one-engine latency alone; the first request after `slow` slow connections were opened;
    with them held open (until shortly before their header deadline); with `bodies` maximal
    bodies sent at once (admitted, refused, peak memory); the list of things done wrong; the
    server's stderr. Figures in a dict."""
    small = one_engine(test)
    latencies(server.base, small, 1)  # warm-up
    alone = latencies(server.base, small, seconds)
    opening = time.monotonic()
    opened = open_slow(server.port, slow)
    # the first request queues behind the server taking in the connections just opened (160 ms
    # idle for 1,000): timed on its own, so the window below measures them held, not arriving
    started = time.perf_counter()
    first = post(server.base, small)[0]
    taking_in = (first, 1000 * (time.perf_counter() - started))
    # the window closes before the first of them reaches its header deadline (all answered 408
    # at once then), so on a slow machine it is shorter rather than timing that burst too
    held = min(seconds, opening + header_timeout - 0.5 - time.monotonic())
    with_slow = latencies(server.base, small, held)
    slow_statuses = statuses_of(opened, header_timeout + 10)
    limits = _limits_of(server)
    biggest = worst_body(limits["max_body"])
    idle = server.resident()
    server.reset_peaks()
    stop, loaded = threading.Event(), []
    measuring = threading.Thread(
        target=lambda: loaded.extend(latencies(server.base, small, 600, stop)))
    measuring.start()
    sent = at_once(server.base, [(biggest, "json")] * bodies)
    stop.set()
    measuring.join()
    peak = server.peak() - idle
    listed = the_list(server, test)
    expensive = costly(server, limits)
    lanes = cpu_where(server, worst_body(2 * MB))
    alive = post(server.base, small)[0] == 200 and server.process.poll() is None
    return {"alone": alone, "taking_in": taking_in, "with_slow": with_slow,
            "slow": slow_statuses,
            "with_bodies": loaded, "bodies": sent, "body_mb": len(biggest) / MB,
            "peak_mb": peak / MB, "budget_mb": limits["memory_mb"], "list": listed,
            "costly": expensive,
            "alive": alive, "stderr": server.stderr_lines(), "lanes": lanes}


def cpu_where(server: Server, body: bytes) -> dict:
    """Where a body above 1 MiB was worked on: the CPU seconds it cost the server's own
    process and the others (its worker), the server otherwise idle."""
    time.sleep(0.5)
    before = server.cpu_seconds()
    status = post(server.base, body)[0]
    after = server.cpu_seconds()
    main = server.process.pid
    spent = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
    return {"status": status, "server_s": spent.get(main, 0.0),
            "others_s": sum(v for pid, v in spent.items() if pid != main)}


def _limits_of(server: Server) -> dict:
    """The limits the server says it runs with (its startup line)."""
    import re

    line = next(text for text in server.stderr_lines() if text.startswith("serving "))
    body = float(re.search(r"bodies up to ([0-9.]+) MB", line).group(1))
    memory = float(re.search(r"a memory budget of ([0-9.]+) MB", line).group(1))
    return {"max_body": int((body - 0.05) * MB), "memory_mb": memory}  # printed to 0.1 MB


# ------------------------------------------------------------------ the bench

def _champion(scratch: Path, data_dir: Path) -> str:
    """The default recipe trained one epoch, as a model folder."""
    from bench.lean import MODEL_URI
    from bench.lean import _champion as register

    store = scratch / "store"
    store.mkdir()
    register(store, data_dir)
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{store}/mlflow.db")
    try:
        return mlflow.artifacts.download_artifacts(MODEL_URI, dst_path=str(scratch / "model"))
    finally:
        mlflow.set_tracking_uri(None)


def bench_serving(quick: bool = False) -> dict:
    from rul.data import load_subset
    from rul.serving.limits import Limits

    data_dir = Path(os.environ.get("CMAPSS_DIR", ROOT / "data" / "cmapss"))
    test = load_subset("FD001", data_dir).test
    size = (8 if quick else 32) * MB
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        model = _champion(scratch, data_dir)
        unbounded = Server(model, ["--memory-mb", 16000, "--max-body-mb", 1000]).start(scratch)
        try:
            idle = unbounded.resident()
            memory = memory_rows(unbounded, size, test)
            biggest = worst_body(Limits().max_body)
            latency = latency_rows(unbounded, test, biggest)
        finally:
            unbounded.stop()
        seconds = 5 if quick else 15
        deadline = seconds + 5  # the slow connections are held through the timing window
        guarded = Server(model, ["--header-timeout", deadline]).start(scratch)
        try:
            found = hostile(guarded, test, slow=200 if quick else 1000, seconds=seconds,
                            bodies=4, header_timeout=deadline)
        finally:
            guarded.stop()
    rows = [[f"peak memory, {m} ({kind}, {body}), answered {status}", per, peak, seconds]
            for m, kind, body, status, peak, per, seconds in memory]
    rows += [[f"latency: {what} ({n} requests)", f"p50 {p50}, p99 {p99}", "", ""]
             for what, n, p50, p99 in latency]
    rows += hostile_rows(found)
    rows.append(["the server's processes, idle (server, fork server, worker)",
                 f"{idle / MB:.0f} MB", "", ""])
    for row in rows:
        print("serving:", " | ".join(str(v) for v in row if v != ""))
    return {"columns": ["what", "measured", "peak", "time"], "rows": rows}


def hostile_rows(found: dict) -> list[list]:
    alone, slow, loaded = found["alone"], found["with_slow"], found["with_bodies"]
    cut = sum(sum(v.values()) for v in found["slow"].values())
    answered = {kind: ", ".join(f"{n} x {s}" for s, n in sorted(v.items()))
                for kind, v in found["slow"].items()}
    statuses = sorted(status for status, _ in found["bodies"])
    return [
        ["hostile: one engine alone", f"p50 {statistics.median(alone):.0f} ms, "
         f"p99 {percentile(alone, 0.99):.0f} ms ({len(alone)} requests)", "", ""],
        [f"hostile: one engine just after {cut} slow connections were opened",
         f"answered {found['taking_in'][0]} in {found['taking_in'][1]:.0f} ms (the server "
         "taking them in)", "", ""],
        [f"hostile: one engine with {cut} slow connections open",
         f"p50 {statistics.median(slow):.0f} ms, p99 {percentile(slow, 0.99):.0f} ms "
         f"({len(slow)} requests)", "", ""],
        *[[f"hostile: slow connections, {kind}", said, "", ""] for kind, said in answered.items()],
        [f"hostile: {len(statuses)} maximal bodies at once ({found['body_mb']:.1f} MB JSON, "
         f"budget {found['budget_mb']:g} MB)", f"answered {statuses}",
         f"{found['peak_mb']:.0f} MB", ""],
        ["hostile: one engine while they run", f"p50 {statistics.median(loaded):.0f} ms, "
         f"p99 {percentile(loaded, 0.99):.0f} ms ({len(loaded)} requests)", "", ""],
        *[[f"hostile: {what}", f"{status}: {line}", "", ""]
          for what, status, line in found["list"]],
        *[[f"hostile: {what}, alone (budget {found['budget_mb']:g} MB)", f"answered {status}",
           f"{peak:.0f} MB", ""] for what, status, peak in found.get("costly", [])],
        ["hostile: a 2 MB body, alone: CPU in the server's process and in its worker",
         f"{found['lanes']['server_s']:.2f} s and {found['lanes']['others_s']:.2f} s", "", ""],
        ["hostile: afterwards", f"server up: {'yes' if found['alive'] else 'NO'}, stderr "
         f"{len(found['stderr'])} lines", "", ""],
    ]
