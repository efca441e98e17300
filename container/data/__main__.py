"""`python -m container.data pack ...`: the name the Makefile and the docs have long used."""

import sys

from container.data.packing import main

if sys.argv[1:2] != ["pack"]:
    print("usage: python -m container.data pack ... (see python -m container.data.packing --help)",
          file=sys.stderr)
    raise SystemExit(2)
raise SystemExit(main(sys.argv[2:], prog="python -m container.data pack"))
