"""`python -m luftpause.dataplane`: the dataplane, as `--workers` starts each of its workers."""

import sys

from luftpause.dataplane.main import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
