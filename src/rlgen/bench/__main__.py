"""`python -m rlgen.bench <overrides> [--out DIR]`."""

import sys

from rlgen.bench.run import main

if __name__ == "__main__":
    sys.exit(main())
