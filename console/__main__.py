"""`python -m console` and the `slo-console` script."""

import sys

from console.cli import main

if __name__ == "__main__":
    sys.exit(main())
