"""`python -m recurlen ...` is the `recurlen` command."""

import sys

from recurlen.commands.cli import main

if __name__ == "__main__":
    sys.exit(main())
