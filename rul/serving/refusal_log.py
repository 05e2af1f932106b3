"""The server's log under attack: one line per kind of event per interval, never a flood.

Every record the server, uvicorn and asyncio log goes through `Throttle`: the first record of
a kind (its logger and its message before formatting: "refused: ... over the cap of %d open
connections" is one kind whatever the numbers) is written, the next ones within INTERVAL_S
are counted, and the first one after it says how many there were. A traceback is written
with the first record of its kind only. `install` puts it on the one handler the server logs
through (stderr) and routes asyncio's "socket.accept() out of system resource" there too,
without its traceback.
"""

import logging
import sys
import time

INTERVAL_S = 10.0


class Throttle(logging.Filter):
    def __init__(self, interval: float = INTERVAL_S, clock=time.monotonic):
        super().__init__()
        self.interval, self.clock = interval, clock
        self.last: dict[tuple, float] = {}
        self.held: dict[tuple, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = self.clock()
        if now - self.last.get(key, -float("inf")) < self.interval:
            self.held[key] = self.held.get(key, 0) + 1
            return False
        self.last[key] = now
        held = self.held.pop(key, 0)
        if held:
            record.msg = f"{record.getMessage()} (and {held} more like it in the last " \
                         f"{self.interval:g} s)"
            record.args = None
        return True


def install(level: int = logging.WARNING) -> Throttle:
    """Log the server's, uvicorn's and asyncio's records to stderr through one Throttle."""
    throttle = Throttle()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    handler.addFilter(throttle)
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "asyncio", "rul.serving"):
        logging.getLogger(name).setLevel(level)
    return throttle


def loop_exception_handler(loop, context: dict) -> None:
    """asyncio's errors, one line each through the log (the throttle above): an accept that
    failed for want of file descriptors is a refusal, not a traceback."""
    message = context.get("message", "asyncio error")
    error = context.get("exception")
    reason = f": {type(error).__name__}: {error}" if error is not None else ""
    logging.getLogger("asyncio").error(f"{message}{reason}".replace("%", "%%"))
