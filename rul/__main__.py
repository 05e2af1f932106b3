"""`python -m rul` (and `torchrun -m rul`) is the `rul` command."""

from rul.cli import main

if __name__ == "__main__":
    main()
