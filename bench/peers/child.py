"""One loop of `bench peers` in its own process:
`python -m bench.peers.child LOOP --epochs N [--dry-run] --out FILE` writes its result as JSON
to FILE (stdout is left to the framework's own messages)."""

import argparse
import importlib
import json
import sys
from pathlib import Path

from bench.peers import LOOPS
from bench.peers.common import Setup


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("loop", choices=list(LOOPS))
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    setup = Setup.of(args.epochs, args.dry_run)  # not timed: the same in every loop
    result = importlib.import_module(LOOPS[args.loop]).train(setup)
    args.out.write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
