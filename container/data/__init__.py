"""Training data: packing text into token blocks (pack), reading them in a global order (loader).

`from container.data import byte_tokenize, pack, write_jsonl` is the name notebooks have long used
for the packing functions (container.data.pack).
"""

from container.data.pack import byte_tokenize, pack, write_jsonl

__all__ = ["byte_tokenize", "pack", "write_jsonl"]
