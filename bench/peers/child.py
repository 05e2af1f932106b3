"""One loop of `bench peers` in a process of its own (spawned: nothing inherited from the
runner's). It prepares its inputs (untimed, while the others do theirs), then trains when its
turn comes (common.Baton) and sends its result, or the error that stopped it."""

import importlib
import traceback

from bench.peers import LOOPS
from bench.peers.common import Baton, Setup


def serve(loop: str, epochs: int, dry: bool, conn) -> None:
    try:
        setup = Setup.of(epochs, dry, Baton(conn))
        conn.send(("result", importlib.import_module(LOOPS[loop]).train(setup)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()
