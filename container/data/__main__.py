"""`python -m container.data pack ...`: the name the Makefile and the docs have long used;
`python -m container.data tiny-chat --output DIR`: a tiny chat model and data to try chat fine-tuning offline;
`python -m container.data inspect PATH`: what a channel holds (smlaunch's shards, a Megatron-Core corpus, JSON Lines
token records, chat records with --tokenizer)."""

import sys

COMMANDS = {"pack": "container.data.packing", "tiny-chat": "container.data.tiny_chat",
            "inspect": "container.data.inspect_corpus"}

command = sys.argv[1] if len(sys.argv) > 1 else None
if command not in COMMANDS:
    print("usage: python -m container.data {pack,tiny-chat,inspect} ... (see python -m container.data.packing --help, "
          "python -m container.data.tiny_chat --help, python -m container.data.inspect_corpus --help)", file=sys.stderr)
    raise SystemExit(2)
module = __import__(COMMANDS[command], fromlist=["main"])
raise SystemExit(module.main(sys.argv[2:], prog=f"python -m container.data {command}"))
