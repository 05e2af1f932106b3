"""The server's memory budget: a request is admitted only if its expected peak fits what is left.

A request's expected peak is its body's size times the measured peak-to-body ratio of its
format (PEAK_PER_BYTE). `python -m bench serving` measures the ratios on the worst bodies a
client can send (every value one digit: the most rows per byte), as the growth of the server's
processes at the request's peak over their idle size, divided by the body's size. A Parquet
body is compressed, so its ratio applies to the size it decodes to (rows x columns x 8 bytes,
from its footer), never to the bytes sent: 200 kB of zeros decode to gigabytes. Reading that
footer costs memory of its own, FOOTER_PEAK_PER_BYTE times its size (a body of 100,000 columns
is mostly footer): a Parquet body is admitted by its footer before the footer is read, and by
both once it is (`parquet_peak`).

A JSON body's peak is also bounded below by its containers (each `{` or `[`: a dict or list
in Python, then a row or cell in pandas): a body of empty objects or nested lists is few bytes
per container (`json_peak`), where the byte ratio measured on rows of numbers fell short (44 MiB
of nested empty objects took 1.7 GB, 37x its bytes).

An engine costs PEAK_PER_ENGINE on top of its rows (its window is padded to the model's, and
it gets an answer of its own), which the byte ratios, measured on engines of 200 cycles, do not
count: a body may hold as many engines as an eighth of its expected peak pays for
(`engines_allowed`: the ratios were rounded up by about that), counted once its rows are read,
before anything is predicted (rul.serving.scoring). Real histories stay far within it (FD001's
100 test engines in 2 MB of CSV may be 800); 100,000 one-row engines in 5.3 MB of CSV took
200-274 MB, admitted at 85 MB.

Large requests may take the budget but its SMALL_SHARE: that share is kept for the requests
small enough to be answered in the server's own process (rul.serving.lanes), so that maximal
bodies never leave a one-engine request without memory. The body limit's default is the
largest body whose expected peak fits what large requests may take. The budget is kept by the
event loop alone (no locks): reserve, grow, release.
"""

# Peak bytes per body byte (per decoded byte for Parquet), measured by `python -m bench
# serving` (docs/data/performance.yaml, "serving memory") and rounded up.
PEAK_PER_BYTE = {"json": 19.0, "csv": 16.0, "parquet": 7.0}
# What parsing a Parquet footer takes per byte of it (its metadata and schema): 17 measured on
# a body of 100,000 one-row columns (19 MB of footer, +304 MB), rounded up.
FOOTER_PEAK_PER_BYTE = 20.0
# What a JSON container takes once parsed and made a frame, per `{` or `[`: 76 (a list of
# empty records), 95 (lists nested six deep), 111 (two-number rows, which the byte ratio
# covers) measured by rul.serving.bodies.read_body; rounded up for the first two.
PEAK_PER_CONTAINER = 100
# What an engine may cost beyond its rows: 1.5 to 4.5 KB measured on 2,000 to 100,000 one-row
# engines in CSV and JSON (docs/data/performance.yaml, "one-row engines"), rounded up.
PEAK_PER_ENGINE = 5_000
ENGINE_SHARE = 1 / 8  # of a body's expected peak, the most its engines may add
ENGINES_AT_LEAST = 64  # a request's allowance whatever its size (320 KB, within the idle margin)
RETRY_AFTER_S = 2  # a refused request's Retry-After: most requests finish well within it
SMALL_SHARE = 1 / 8  # of the budget, kept for small requests


def expected_peak(media: str, size: int) -> int:
    """The memory a request of `size` bytes of `media` is expected to take at its peak."""
    return int(PEAK_PER_BYTE[media] * size)


def engines_allowed(media: str, size: int) -> int:
    """The engines a body of `size` bytes (for Parquet: the bytes its rows take as read) may
    hold: as many as ENGINE_SHARE of its expected peak pays for, at least ENGINES_AT_LEAST."""
    return max(ENGINES_AT_LEAST, int(ENGINE_SHARE * expected_peak(media, size)) // PEAK_PER_ENGINE)


def json_peak(body: bytes) -> int:
    """A JSON body's expected peak: by its bytes, or by its containers where they cost more
    (a `{` or `[` inside a string counts too: more, never less)."""
    containers = body.count(b"{") + body.count(b"[")
    return max(expected_peak("json", len(body)), PEAK_PER_CONTAINER * containers)


def parquet_peak(decoded: int, footer: int) -> int:
    """A Parquet body's expected peak: its footer read (`footer` bytes), then the `decoded`
    bytes of the columns read."""
    return expected_peak("parquet", decoded) + int(FOOTER_PEAK_PER_BYTE * footer)


def largest_body(memory: int) -> int:
    """The largest text body (JSON or CSV) whose expected peak fits what large requests may
    take of a budget of `memory` bytes."""
    return int(memory * (1 - SMALL_SHARE) / max(PEAK_PER_BYTE["json"], PEAK_PER_BYTE["csv"]))


class Budget:
    """`total` bytes shared by the requests in flight."""

    def __init__(self, total: int):
        self.total, self.used = int(total), 0

    def reserve(self, amount: int, small: bool = False) -> "Reservation | None":
        """A reservation of `amount` bytes, or None when it does not fit what is left."""
        reservation = Reservation(self)
        return reservation if reservation.grow(amount, small) else None

    def limit(self, small: bool) -> int:
        """What requests may hold in all: the whole budget for a small one, the budget but
        its SMALL_SHARE for a large one."""
        return self.total if small else int(self.total * (1 - SMALL_SHARE))


class Reservation:
    def __init__(self, budget: Budget):
        self.budget, self.amount = budget, 0

    def grow(self, amount: int, small: bool = False) -> bool:
        """Hold `amount` bytes in all (more than now, or nothing changes); False when the
        difference does not fit (`small`: a request the server's own process answers)."""
        extra = int(amount) - self.amount
        if extra <= 0:
            return True
        if self.budget.used + extra > self.budget.limit(small):
            return False
        self.budget.used += extra
        self.amount += extra
        return True

    def release(self) -> None:
        self.budget.used -= self.amount
        self.amount = 0
