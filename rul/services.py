"""Servers rul talks to (a database for Optuna or MLflow, an MLflow tracking server) that do
not answer: retried for a bounded time with a countdown on stderr, then ServiceUnavailable,
one line, which the command line ends with exit code 69 (EX_UNAVAILABLE in sysexits.h).

The time to wait is RUL_CONNECT_TIMEOUT seconds (default 60). A server that answers but
refuses (a wrong password, a database that does not exist) is a bad URL: ConfigError at once.
"""

import os
import sys
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from rul.urls import masked, missing_driver, remember, scrubbed, with_driver

EXIT_CODE = 69  # EX_UNAVAILABLE: "a service is unavailable"
TIMEOUT_ENV = "RUL_CONNECT_TIMEOUT"
DEFAULT_TIMEOUT = 60.0
# Waits between attempts, seconds; the last one repeats until the time is up.
DELAYS = (1, 2, 4, 8)


class ServiceUnavailable(Exception):
    """A server did not answer within the time allowed."""


def timeout() -> float:
    """RUL_CONNECT_TIMEOUT, seconds (0: one attempt)."""
    from rul.config import ConfigError

    value = os.environ.get(TIMEOUT_ENV, "").strip()
    if not value:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ConfigError(f"{TIMEOUT_ENV}={value!r}: must be a number of seconds >= 0")
    return seconds


def wait_for(what: str, attempt: Callable[[], None], why_down: Callable[[Exception], str | None],
             advice: str, seconds: float | None = None, stream=None) -> None:
    """Call `attempt()` until it returns. An exception for which `why_down(error)` gives a
    reason (the server did not answer) is retried until `seconds` (default: `timeout()`)
    have passed, with a countdown on `stream` (stderr); then ServiceUnavailable says
    `what` is not reachable, why, and `advice`. Other exceptions propagate."""
    seconds = timeout() if seconds is None else seconds
    stream = stream or sys.stderr
    what = scrubbed(what)  # every line below says it: no secret of a URL in it
    deadline, tries = time.monotonic() + seconds, 0
    countdown = _Countdown(stream)
    while True:
        try:
            attempt()
            countdown.close()
            return
        except Exception as error:  # noqa: BLE001 (why_down decides, others re-raised)
            reason = why_down(error)
            if reason is None:
                countdown.close()
                raise
            reason = scrubbed(reason)
        left = deadline - time.monotonic()
        if left <= 0:
            countdown.close()
            raise ServiceUnavailable(f"{what} is not reachable ({reason}) after "
                                     f"{_seconds(seconds)}; {advice}") from None
        pause = min(DELAYS[min(tries, len(DELAYS) - 1)], left)
        countdown.show(f"{what} is not reachable ({reason})", pause, deadline)
        tries += 1


def _seconds(value: float) -> str:
    return f"{value:g} s"


class _Countdown:
    """`show` waits `pause` seconds while saying so: on a terminal one line counts down in
    place, every second; elsewhere (a log) one line per attempt."""

    def __init__(self, stream):
        self.stream = stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.open = False

    def show(self, said: str, pause: float, deadline: float) -> None:
        now = time.monotonic()
        end = now + pause
        if not self.tty:
            print(f"{said}; retrying in {pause:.0f} s, giving up in {deadline - now:.0f} s",
                  file=self.stream, flush=True)
            time.sleep(pause)
            return
        while now < end:
            self.stream.write(f"\r{said}; retrying, giving up in {deadline - now:3.0f} s\x1b[K")
            self.stream.flush()
            self.open = True
            time.sleep(min(1.0, end - now))
            now = time.monotonic()

    def close(self) -> None:
        if self.open:
            self.stream.write("\n")
            self.stream.flush()
            self.open = False


# ------------------------------------------------------------------ the kinds of server


# A database server's words when it answered and refused: retrying cannot help.
REFUSALS = ("authentication failed", "does not exist", "no password supplied",
            "access denied", "unknown database", "permission denied")


def wait_for_database(url: str, what: str) -> None:
    """Connect once to the database server at `url` (an SQLAlchemy URL) and close; wait for
    it as `wait_for` says. A refusal is a ConfigError naming `what`."""
    import sqlalchemy

    from rul.config import ConfigError

    remember(url)
    missing = missing_driver(url)
    if missing:
        raise ConfigError(f"{what} {masked(url)}: {missing}")
    engine = sqlalchemy.create_engine(with_driver(url), poolclass=sqlalchemy.pool.NullPool)

    def attempt() -> None:
        with engine.connect():
            pass

    def why_down(error: Exception) -> str | None:
        if not isinstance(error, sqlalchemy.exc.OperationalError):
            return None
        said = scrubbed(" ".join(str(error.orig or error).split("\n")[0].split()), url)
        if any(word in said.lower() for word in REFUSALS):
            raise ConfigError(f"{what} {masked(url)}: {said}") from None
        return said.split(": ")[-1].removesuffix(".").lower()  # "connection refused"

    try:
        wait_for(f"{what} {masked(url)}", attempt, why_down,
                 "start the database server or check the URL (host, port)")
    finally:
        engine.dispose()


def wait_for_http(uri: str, what: str) -> None:
    """An MLflow tracking server at `uri` answers HTTP (any status: it is up); wait for it as
    `wait_for` says."""
    import requests

    remember(uri)
    parts = urlsplit(uri)  # /health on the path, the query kept after it (a token)
    health = parts._replace(path=parts.path.rstrip("/") + "/health").geturl()

    def attempt() -> None:
        requests.get(health, timeout=10)

    def why_down(error: Exception) -> str | None:
        if isinstance(error, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
            return _connection_reason(error)
        return None

    wait_for(f"{what} {masked(uri)}", attempt, why_down,
             "start it (make server) or check the URL (host, port)")


def _connection_reason(error: Exception) -> str:
    text = str(error)
    for known in ("Connection refused", "Name or service not known", "timed out",
                  "No route to host", "Network is unreachable", "Connection reset"):
        if known.lower() in text.lower():
            return known.lower()
    return type(error).__name__
