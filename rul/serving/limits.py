"""What the server grants a client: each limit with its default, flag and environment variable.

The one table of them: `python -m rul.serving.server`'s flags, its startup line and the serve
guide's table (tests/test_server_limits.py) read it. The body limit's default follows from the
memory budget (rul.serving.admission: the largest body whose expected peak fits it alone).
Standard library only.
"""

import argparse
import os
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Limit:
    name: str  # the attribute of Limits, and the flag: --memory-mb
    env: str  # the environment variable that sets the default
    default: float | None  # None: derived (the body limit, from the memory budget)
    unit: str
    meaning: str  # what happens past it, in the guide's words


LIMITS = (
    Limit("memory_mb", "RUL_SERVE_MEMORY_MB", 1024, "MB",
          "the memory requests in flight may take together: a request is admitted only if its "
          "body's expected peak fits what is left, else 503 with Retry-After; an eighth is kept "
          "for requests of 1 MiB or less (the loaded server, about 450 MB in its processes, "
          "comes on top: the default fits a 2 GB container)"),
    Limit("max_body_mb", "RUL_SERVE_MAX_BODY_MB", None, "MB",
          "a larger body is answered 413 before it is parsed; by default the largest body whose "
          "expected peak fits what large requests may take of the memory budget"),
    Limit("timeout", "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT", 60, "s",
          "a request still predicting after this long gets 504 and its work stops at its next "
          "step or batch of windows"),
    Limit("header_timeout", "RUL_SERVE_HEADER_TIMEOUT", 10, "s",
          "a connection that has not sent a request's headers within this long is answered 408 "
          "and closed; it is also the body's grace before the minimum rate applies"),
    Limit("min_rate_kb", "RUL_SERVE_MIN_RATE_KB", 64, "KB/s",
          "a body arriving slower than this on average (after the grace) is answered 408 and "
          "closed; a client that reads nothing of its answer for as long as the grace is "
          "dropped"),
    Limit("keep_alive", "RUL_SERVE_KEEP_ALIVE", 5, "s",
          "an idle keep-alive connection is closed after this long"),
    Limit("max_connections", "RUL_SERVE_MAX_CONNECTIONS", 2048, "connections",
          "a connection above this many open ones is answered 503 with Retry-After and closed "
          "(the open-files limit is raised to fit, where the system allows)"),
)


@dataclass(frozen=True)
class Limits:
    memory_mb: float = 1024
    max_body_mb: float | None = None
    timeout: float = 60
    header_timeout: float = 10
    min_rate_kb: float = 64
    keep_alive: float = 5
    max_connections: int = 2048

    @property
    def memory(self) -> int:
        return int(self.memory_mb * 2**20)

    @property
    def max_body(self) -> int:
        from rul.serving.admission import largest_body

        if self.max_body_mb is None:
            return largest_body(self.memory)
        return int(self.max_body_mb * 2**20)

    @property
    def min_rate(self) -> float:
        return self.min_rate_kb * 1024


assert [f.name for f in fields(Limits)] == [limit.name for limit in LIMITS]
assert all(getattr(Limits, f.name) == limit.default for f, limit in zip(fields(Limits), LIMITS))


METAVAR = {"MB": "MB", "s": "S", "KB/s": "KB", "connections": "N"}


def add_flags(parser: argparse.ArgumentParser, environ=os.environ) -> None:
    """One flag per limit, its default from its environment variable or the table."""
    for limit in LIMITS:
        number = int if limit.unit == "connections" else float
        raw = environ.get(limit.env)
        default = limit.default if raw in (None, "") else _parse(parser, limit, number, raw)
        shown = "from --memory-mb" if limit.default is None else f"{limit.default:g} {limit.unit}"
        parser.add_argument(f"--{limit.name.replace('_', '-')}", type=number, default=default,
                            metavar=METAVAR[limit.unit],
                            help=f"{limit.meaning} (default {shown}; env {limit.env})")


def _parse(parser, limit: Limit, number, raw: str):
    try:
        return number(raw)
    except ValueError:
        parser.error(f"{limit.env} must be a number of {limit.unit}")


def from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Limits:
    """The limits a command line asked for; a value that is not positive is one line."""
    values = {limit.name: getattr(args, limit.name) for limit in LIMITS}
    for limit in LIMITS:
        value = values[limit.name]
        if value is not None and not value > 0:
            parser.error(f"--{limit.name.replace('_', '-')} must be positive")
    return Limits(**values)
