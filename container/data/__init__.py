"""Training data: packing text into token blocks (packing), reading them in a global order (loader).

`from container.data import byte_tokenize, pack, write_jsonl` is the name notebooks have long used
for the packing functions (container.data.packing). They load on first use, so that
`python -m container.data.packing` does not find its own module imported before it runs.
"""

import importlib

__all__ = ["byte_tokenize", "pack", "write_jsonl"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("container.data.packing"), name)
    raise AttributeError(f"module 'container.data' has no attribute {name!r}")
