"""`python -m container.data inspect PATH`: what a token channel holds, smlaunch's own shards, a
Megatron-Core corpus or JSON Lines token records (container.data.inspect_records); PATH: a
directory, read as a job reads the channel, or one file.

    python -m container.data inspect build/data/train                  # each file and the total
    python -m container.data inspect web_text_document.idx --json      # the same, as one JSON object
    python -m container.data inspect build/data/train --documents 0:10 --json   # their token ids

The summary: each file's format, dtype, documents and tokens, the tokenizer it records (Megatron's
files record none), and the documents' lengths in power-of-two buckets (a bucket b: lengths in
[2^b, 2^(b+1)), as smlaunch's headers keep them; a Megatron corpus's are counted from its index,
one pass over 20 bytes a sequence, never over the tokens). `--documents A:B` prints documents A to
B-1 of the channel, numbered across its files in reading order, one JSON object a line
({"document", "input_ids"}, and "text" with --decode TOKENIZER): for a Megatron corpus a document
is its sequences back to back, as its IndexedDataset gives them. Errors are one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from container.data import inspect_records as records
from container.data.corpus import PackError
from container.data.encoders import load_tokenizer
from container.data.indexed import TokenStream
from container.data.inspect_records import RecordError
from launcher.wire.megatron_index import FORMAT, MegatronHeader
from launcher.wire.megatron_index import length_buckets as megatron_lengths
from launcher.wire.token_shards import ShardError, is_indexed


def parse_args(argv: Sequence[str] | None, prog: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description="What a token channel (smlaunch's shards, a "
                                                            "Megatron-Core corpus, JSON Lines token records) holds.")
    parser.add_argument("path", help="a channel directory, or one .idx or .jsonl file")
    parser.add_argument("--documents", metavar="A:B", help="print documents A to B-1 (numbered across the "
                                                           "channel's files): their token ids, one JSON line each")
    parser.add_argument("--json", action="store_true", help="the summary as one JSON object")
    parser.add_argument("--decode", metavar="TOKENIZER", help="with --documents: each document's text too, decoded "
                                                              "by this tokenizer (a directory or Hub id), or 'bytes' "
                                                              "for UTF-8 byte tokens")
    args = parser.parse_args(argv)
    if args.documents is not None:
        args.documents = _span(parser, args.documents)
    elif args.decode is not None:
        parser.error("--decode applies to --documents A:B")
    return args


def decoder(name: str | None):
    """ids -> text by the tokenizer named; None without one."""
    if name is None:
        return None
    tokenizer = None if name == "bytes" else load_tokenizer(name)
    size = 256 if tokenizer is None else len(tokenizer)

    def decode(ids: list[int]) -> str:
        # a tokenizer's decode drops an id it does not have without a word
        bad = next((i for i in ids if not 0 <= i < size), None)
        if bad is not None:
            raise RecordError(f"--decode {name}: id {bad} is outside its {size:,} ids; name the corpus's tokenizer")
        return bytes(ids).decode("utf-8", errors="replace") if tokenizer is None else tokenizer.decode(ids)

    return decode


def _span(parser: argparse.ArgumentParser, text: str) -> tuple[int, int | None]:
    begin, sep, end = text.partition(":")
    try:
        span = (int(begin or 0), int(end) if end else None)
    except ValueError:
        span = None
    if not sep or span is None or span[0] < 0 or (span[1] is not None and span[1] < span[0]):
        parser.error(f"--documents {text!r}: give A:B, whole numbers with 0 <= A <= B (B may be left out: to the end)")
    return span


def length_buckets(shard) -> dict[int, list[int]]:
    """bucket -> [count, tokens] of a shard's documents' lengths: smlaunch's header records them,
    a Megatron corpus's index is read for them (launcher.wire.megatron_index.length_buckets)."""
    header = shard.header
    rows = (megatron_lengths(header) if isinstance(header, MegatronHeader)
            else header.fields.get("lengths", {}).get("buckets", []))
    return {row[0]: [row[1], row[2]] for row in rows}


def file_summary(shard, path: Path) -> dict:
    header = shard.header
    megatron = isinstance(header, MegatronHeader)
    summary = {"file": str(header.idx.relative_to(path) if path.is_dir() else header.idx.name),
               "format": FORMAT if megatron else "smlaunch indexed tokens v1",
               "dtype": header.dtype, "documents": header.documents, "tokens": header.tokens,
               "tokenizer": header.tokenizer, "vocab_size": header.vocab_size, "max_token_id": header.max_token_id,
               "lengths": {str(b): row for b, row in length_buckets(shard).items()}}
    if megatron:
        summary["sequences"] = header.sequences
    return summary


def add_length(lengths: dict[str, list[int]], length: int) -> None:
    """Count one document of `length` tokens into its bucket's [count, tokens]."""
    row = lengths.setdefault(str(max(length, 1).bit_length() - 1), [0, 0])
    row[0], row[1] = row[0] + 1, row[1] + length


def with_totals(report: dict) -> dict:
    """The report with the channel's documents, tokens and lengths summed over its files."""
    totals: dict[str, list[int]] = {}
    for f in report["files"]:
        for b, (count, tokens) in f["lengths"].items():
            row = totals.setdefault(b, [0, 0])
            row[0], row[1] = row[0] + count, row[1] + tokens
        f["lengths"] = dict(sorted(f["lengths"].items(), key=lambda kv: int(kv[0])))
    return {**report, "documents": sum(f["documents"] for f in report["files"]),
            "tokens": sum(f["tokens"] for f in report["files"]),
            "lengths": dict(sorted(totals.items(), key=lambda kv: int(kv[0])))}


def summary(stream: TokenStream, path: Path) -> dict:
    return with_totals({"path": str(path), "files": [file_summary(shard, path) for shard in stream.shards]})


def text(report: dict) -> str:
    lines = [f"{report['path']}: {len(report['files'])} file(s), {report['documents']:,} documents, "
             f"{report['tokens']:,} tokens"]
    for f in report["files"]:
        tokenizer = (f"tokenizer {f['tokenizer']['name']} (vocab_size {f['vocab_size']:,}, largest id "
                     f"{f['max_token_id']:,})" if f["tokenizer"] else "no tokenizer recorded (the job names it)")
        dtype = f"{f['dtype']}, " if f["dtype"] else ""
        records = f"{f['records']:,} records, " if "records" in f else ""
        lines.append(f"  {f['file']}: {f['format']}, {dtype}{records}{f['documents']:,} documents, "
                     f"{f['tokens']:,} tokens; {tokenizer}")
    lines.append("  document lengths (tokens)      documents        tokens")
    for b, (count, tokens) in report["lengths"].items():
        low, high = 2 ** int(b), 2 ** (int(b) + 1)
        span = f"[{0 if int(b) == 0 else low:,}, {high:,})"
        lines.append(f"  {span:<28} {count:>11,} {tokens:>13,}")
    return "\n".join(lines)


def shard_documents(stream: TokenStream, begin: int, end: int | None):
    """(number, token ids) of the channel's documents [begin, end), numbered across its files."""
    first = 0
    for shard in stream.shards:
        count = shard.header.documents
        stop = count if end is None else min(count, end - first)
        for d in range(max(begin - first, 0), stop):
            a, b = shard.documents.bounds(d)
            yield first + d, shard.tokens[a:b].tolist()
        first += count
        if end is not None and first >= end:
            return


def main(argv: Sequence[str] | None = None, prog: str = "python -m container.data.inspect_corpus") -> int:
    args = parse_args(argv, prog)
    path = Path(args.path)
    try:
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file or directory")
        stream = TokenStream(path) if is_indexed(path) else None
        if args.documents is not None:
            decode = decoder(args.decode)
            found = (shard_documents(stream, *args.documents) if stream is not None else
                     records.documents(path, *args.documents))
            for number, ids in found:
                decoded = {"text": decode(ids)} if decode is not None else {}
                print(json.dumps({"document": number, "input_ids": ids, **decoded}, ensure_ascii=False))
            return 0
        report = summary(stream, path) if stream is not None else with_totals(records.summary(path, add_length))
    except (ShardError, FileNotFoundError, RecordError, PackError, UnicodeDecodeError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1) if args.json else text(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
