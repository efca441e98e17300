"""`python -m container.data inspect PATH`: what a channel holds, smlaunch's own shards, a
Megatron-Core corpus, JSON Lines token records (container.data.inspect_records) or chat records
(JSON Lines or Parquet, tokenized with --tokenizer as the job tokenizes them:
container.data.inspect_chat); PATH: a directory, read as a job reads the channel, or one file.

    python -m container.data inspect build/data/train                  # each file and the total
    python -m container.data inspect web_text_document.idx --json      # the same, as one JSON object
    python -m container.data inspect build/data/train --documents 0:10 --json   # their token ids
    python -m container.data inspect data/chat --tokenizer DIR --max-context-width 4096   # as the job packs it

The summary: each file's format, dtype, documents and tokens, the tokenizer it records (Megatron's
files record none), and the documents' lengths in power-of-two buckets (a bucket b: lengths in
[2^b, 2^(b+1)), as smlaunch's headers keep them; a Megatron corpus's are counted from its index,
one pass over 20 bytes a sequence, never over the tokens); with --max-context-width N the rows a
job of that width makes. `--documents A:B` prints documents A to B-1 of the channel, numbered across
its files in reading order, one JSON object a line ({"document", "input_ids"}, and "text" with
--decode TOKENIZER): for a Megatron corpus a document is its sequences back to back, as its
IndexedDataset gives them; for chat records an example with its labels. Errors are one line on
stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from container.data import inspect_chat as chat
from container.data import inspect_mixture as mixtures
from container.data import inspect_records as records
from container.data.chat_source import TRUNCATION_MODES
from container.data.corpus import PackError
from container.data.encoders import load_tokenizer
from container.data.indexed import TokenStream
from container.data.inspect_mixture import MixtureOptionError
from container.data.inspect_records import RecordError
from launcher.wire.chat_records import ChatRecordError
from launcher.wire.megatron_index import FORMAT, MegatronHeader
from launcher.wire.megatron_index import length_buckets as megatron_lengths
from launcher.wire.token_shards import ShardError, is_indexed
from launcher.wire.training.data_order import ROUND


def parse_args(argv: Sequence[str] | None, prog: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description="What a channel (smlaunch's shards, a Megatron-Core "
                                                            "corpus, JSON Lines token records, chat records) holds.")
    parser.add_argument("path", help="a channel directory, or one .idx, .jsonl or .parquet file; with --mixture, "
                                     "the directory holding the channels")
    parser.add_argument("--documents", metavar="A:B", help="print documents A to B-1 (numbered across the "
                                                           "channel's files): their token ids, one JSON line each")
    parser.add_argument("--json", action="store_true", help="the summary as one JSON object")
    parser.add_argument("--decode", metavar="TOKENIZER", help="with --documents: each document's text too, decoded "
                                                              "by this tokenizer (a directory or Hub id), or 'bytes' "
                                                              "for UTF-8 byte tokens")
    parser.add_argument("--tokenizer", metavar="DIR_OR_HUB_ID", help="chat records (required for them): the "
                                                                     "tokenizer and chat template the job uses")
    parser.add_argument("--max-context-width", type=int, metavar="N", help="the job's row width: chat records "
                                                                           "truncated and packed as the job does, "
                                                                           "an indexed channel's rows")
    parser.add_argument("--truncation-mode", choices=TRUNCATION_MODES, help="chat records with --max-context-width: "
                                                                            "the job's truncation_mode (default "
                                                                            "keep_start)")
    parser.add_argument("--mixture", metavar="CHANNEL:WEIGHT,...", help="the job's data_mixture over the indexed "
                                                                       "channels in PATH (PATH/CHANNEL), with "
                                                                       "--max-context-width: what each gives")
    parser.add_argument("--samples", type=int, metavar="N", help="with --mixture: over global samples [0, N) "
                                                                 "(the job's max_steps x its global batch; "
                                                                 f"default {ROUND:,})")
    args = parser.parse_args(argv)
    _check_options(parser, args)
    if args.documents is not None:
        args.documents = _span(parser, args.documents)
    elif args.decode is not None:
        parser.error("--decode applies to --documents A:B")
    return args


def _check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The options that go together (what applies to what a PATH holds: kind_of)."""
    if args.samples is not None and args.mixture is None:
        parser.error("--samples applies with --mixture")
    if args.mixture is not None and (args.max_context_width is None or args.documents is not None or args.tokenizer
                                     or args.truncation_mode):
        parser.error("--mixture takes --max-context-width N (the job's rows), and none of --documents, --tokenizer, "
                     "--truncation-mode (a mixture is of indexed channels)")
    if args.samples is not None and args.samples < 1:
        parser.error(f"--samples {args.samples}: give a positive number of samples")
    if args.max_context_width is not None and args.max_context_width < 1:
        parser.error(f"--max-context-width {args.max_context_width}: give a positive number of tokens")
    if args.truncation_mode is not None and args.max_context_width is None:
        parser.error("--truncation-mode applies with --max-context-width N")


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


SUMMED = ("documents", "tokens", "records", "trained", "truncated", "dropped")  # each file's counts a total sums


def with_totals(report: dict) -> dict:
    """The report with the channel's counts (SUMMED, those its files have) and lengths summed over its files."""
    totals: dict[str, list[int]] = {}
    for f in report["files"]:
        for b, (count, tokens) in f["lengths"].items():
            row = totals.setdefault(b, [0, 0])
            row[0], row[1] = row[0] + count, row[1] + tokens
        f["lengths"] = dict(sorted(f["lengths"].items(), key=lambda kv: int(kv[0])))
    sums = {key: sum(f[key] for f in report["files"]) for key in SUMMED
            if report["files"] and all(key in f for f in report["files"])}
    return {**report, **sums, "lengths": dict(sorted(totals.items(), key=lambda kv: int(kv[0])))}


def summary(stream: TokenStream, path: Path, width: int | None = None) -> dict:
    report = {"path": str(path), "files": [file_summary(shard, path) for shard in stream.shards]}
    if width:  # the rows a job of this width cuts from the channel's tokens
        report.update(max_context_width=width, rows=stream.rows(width))
    return with_totals(report)


def _counts(f: dict) -> str:
    trained = f", {f['trained']:,} trained" if "trained" in f else ""
    cut = f" ({f['truncated']:,} truncated, {f['dropped']:,} dropped)" if f.get("truncated") or f.get("dropped") else ""
    return f"{f['documents']:,} documents, {f['tokens']:,} tokens{trained}{cut}"


def _rows(report: dict) -> list[str]:
    if "rows" not in report:
        return []
    width = report["max_context_width"]
    if "padding" not in report:
        return [f"  rows of {width:,} tokens: {report['rows']:,} (the documents back to back, the rest dropped)"]
    share = report["padding"] / (report["rows"] * width) if report["rows"] else 0.0
    return [f"  rows of {width:,} tokens (truncation_mode {report['truncation_mode']}): {report['rows']:,}, "
            f"packed best-fit (padding {share:.1%})"]


def text(report: dict) -> str:
    lines = [f"{report['path']}: {len(report['files'])} file(s), {_counts(report)}"]
    for f in report["files"]:
        tokenizer = (f"tokenizer {f['tokenizer']['name']} (vocab_size {f['vocab_size']:,}, largest id "
                     f"{f['max_token_id'] or 0:,})" if f["tokenizer"] else "no tokenizer recorded (the job names it)")
        dtype = f"{f['dtype']}, " if f["dtype"] else ""
        records = f"{f['records']:,} records, " if "records" in f else ""
        lines.append(f"  {f['file']}: {f['format']}, {dtype}{records}{_counts(f)}; {tokenizer}")
    lines += _rows(report)
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


class OptionError(ValueError):
    """An option that does not apply to what PATH holds, or one it needs."""


def kind_of(path: Path, args: argparse.Namespace) -> str:
    """How `path` is read ('indexed', 'chat' or 'records'), checking the options that apply to it."""
    kind = "indexed" if is_indexed(path) else "chat" if chat.is_chat(path) else "records"
    if kind == "chat" and args.tokenizer is None:
        raise OptionError(f"{path} holds chat records, which the job tokenizes with the model's tokenizer and chat "
                          "template: give --tokenizer DIR_OR_HUB_ID (the job's tokenizer or "
                          "hf_pretrained_model_name_or_dir)")
    if kind != "chat" and (args.tokenizer or args.truncation_mode):
        held = "indexed token shards" if kind == "indexed" else "JSON Lines token records"
        raise OptionError(f"{'--tokenizer' if args.tokenizer else '--truncation-mode'} applies to chat records, and "
                          f"{path} holds {held}, already tokenized: leave it out (--documents A:B --decode "
                          "TOKENIZER prints their text)")
    if kind == "records" and args.max_context_width:
        raise OptionError(f"--max-context-width applies to chat records and indexed channels, and {path} holds JSON "
                          "Lines token records, each one row already: leave it out")
    return kind


def found_documents(kind: str, path: Path, args: argparse.Namespace, tokenizer):
    """(number, fields) of the documents --documents A:B names."""
    width, mode = args.max_context_width, args.truncation_mode or "keep_start"
    if kind == "chat":
        return chat.documents(path, tokenizer, width, mode, *args.documents)
    found = (shard_documents(TokenStream(path), *args.documents) if kind == "indexed" else
             records.documents(path, *args.documents))
    return ((number, {"input_ids": ids}) for number, ids in found)


def report_of(kind: str, path: Path, args: argparse.Namespace, tokenizer) -> dict:
    width, mode = args.max_context_width, args.truncation_mode or "keep_start"
    if kind == "indexed":
        return summary(TokenStream(path), path, width)
    if kind == "chat":
        return with_totals(chat.summary(path, tokenizer, width, mode, add_length))
    return with_totals(records.summary(path, add_length))


def main(argv: Sequence[str] | None = None, prog: str = "python -m container.data.inspect_corpus") -> int:
    args = parse_args(argv, prog)
    path = Path(args.path)
    try:
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file or directory")
        if args.mixture is not None:
            report = mixtures.report(path, args.mixture, args.max_context_width, args.samples or ROUND)
            print(json.dumps(report, indent=1) if args.json else mixtures.text(report))
            return 0
        kind = kind_of(path, args)
        tokenizer = chat.open_tokenizer(args.tokenizer) if kind == "chat" else None
        if args.documents is not None:
            decode = decoder(args.decode)
            for number, fields in found_documents(kind, path, args, tokenizer):
                decoded = {"text": decode(fields["input_ids"])} if decode and "input_ids" in fields else {}
                print(json.dumps({"document": number, **fields, **decoded}, ensure_ascii=False))
            return 0
        report = report_of(kind, path, args, tokenizer)
    except (ShardError, FileNotFoundError, RecordError, PackError, ChatRecordError, OptionError, MixtureOptionError,
            UnicodeDecodeError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1) if args.json else text(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
