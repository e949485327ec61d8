"""``python -m mmbatch``; the guard matters because vLLM starts its workers with spawn."""

import sys

from mmbatch.cli import main

if __name__ == "__main__":
    sys.exit(main())
