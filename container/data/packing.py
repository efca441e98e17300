"""Making a data set: documents → tokens → fixed-length blocks → JSON Lines channel files.

    python -m container.data.packing --input docs/ src/ --output train.jsonl --block-size 512
    python -m container.data.packing --input shards/ --text-field content --tokenizer meta-llama/Llama-3.1-8B \\
        --eos --block-size 8192 --output-dir build/data --validation-fraction 0.005
    python -m container.data.packing --dataset Salesforce/wikitext --dataset-config wikitext-103-raw-v1 \\
        --streaming --tokenizer ./tokenizer --block-size 4096 --output-dir build/data

(`python -m container.data pack ...` is the same command.) Documents (container.data.corpus: text
files, JSON Lines or Parquet records, a `datasets` dataset) are tokenized in batches, their
tokens concatenated and cut into --block-size blocks, and the incomplete remainder at the end is
dropped: the seed's `group_texts`, streamed. Tokens are UTF-8 bytes (vocab_size 256, as the
llama3-tiny preset has) unless --tokenizer names a fast `transformers` tokenizer (a local
directory, or a Hub id resolved through the usual HF cache, HF_TOKEN and HF_HUB_OFFLINE).
By default the tokenizer adds what its post-processor adds to every document (Llama 3: a
leading <|begin_of_text|>, as the seed's notebook had it); --eos also ends every document with
the end-of-text token, so a model sees where one document stops and the next begins.

Every record is the seed's {"input_ids", "attention_mask", "labels"} with "position_ids": 0 at
the first token of each document (and of each block: a document cut by a block boundary goes on
as a new document in the next block), then counting up, so the job trains each document on its
own (document masking, docs/data.md); --no-position-ids writes the seed's three fields only, whose
packed documents see each other in training. --output-dir DIR writes
DIR/train/train.jsonl and, with --validation-fraction F, DIR/validation/validation.jsonl: the
job's `train` and `validation` channels. Block i (from 0, in packing order) goes to validation
when the 8-byte blake2b digest of "{seed}:{i}", read big-endian and divided by 2^64, is below F:
the split depends on (--seed, i) only, so the same command gives the same files, and about F of
the blocks validate.

Files are written as hidden temporaries beside their targets and renamed into place at the
end, so an error or an interrupt leaves no partial output (and an --overwrite target intact).
Bad inputs and options are one line on stderr and exit code 2, found before writing when they
can be. A progress line (documents/s, tokens/s) goes to stderr on a terminal, the summary to
stdout.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import islice
from pathlib import Path
from typing import TextIO

from container.data import pack_indexed
from container.data.corpus import PackError, dataset_documents, file_documents
from container.data.encoders import Encode, byte_encode, load_tokenizer, tokenizer_encode
from container.data.indexed import DEFAULT_SHARD_TOKENS
from launcher.wire.token_shards import vocabulary_sha256

OUTPUT_SUFFIXES = (".jsonl", ".jsonl.gz")
FORMATS = ("jsonl", "indexed", "megatron")
INDEXED = ("indexed", "megatron")  # a channel directory of whole documents (container.data.pack_indexed)
BATCH_DOCUMENTS = 1000  # a fast tokenizer spreads one batch over the CPU cores
# bounds a batch's memory when documents are whole files, and keeps batches small enough that
# reading and writing overlap the encoding of the next one (_token_lists)
BATCH_CHARS = 1 << 20


def group(token_lists: Iterable[list[int]], block_size: int) -> Iterator[list[int]]:
    """The seed's `group_texts` over documents' tokens: concatenate, cut into block_size
    blocks, drop the remainder. Only one block's worth is held beyond a document's own tokens."""
    return (block for block, _ in group_documents(token_lists, block_size))


def group_documents(token_lists: Iterable[list[int]], block_size: int) -> Iterator[tuple[list[int], list[int]]]:
    """`group` with each block's position_ids: 0 at each document's first token and at the
    block's first token (a cut document goes on as a new one), else the previous position + 1."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    tokens: list[int] = []
    positions: list[int] = []
    for ids in token_lists:
        tokens.extend(ids)
        positions.extend(range(len(ids)))
        full = len(tokens) // block_size * block_size
        for i in range(0, full, block_size):
            block = positions[i:i + block_size]
            # the leading piece of a document cut by the block boundary restarts at 0
            lead = next((j for j, q in enumerate(block) if q == 0), block_size)
            yield tokens[i:i + block_size], [q - block[0] for q in block[:lead]] + block[lead:]
        del tokens[:full], positions[:full]


def pack(texts: Iterable[str], tokenize: Callable[[str], list[int]],
         block_size: int) -> Iterator[list[int]]:
    """`group` over texts tokenized one at a time (the command line tokenizes in batches)."""
    return group(map(tokenize, texts), block_size)


def byte_tokenize(text: str) -> list[int]:
    """UTF-8 bytes as token ids (vocabulary 256, e.g. the llama3-tiny preset)."""
    return list(text.encode("utf-8"))


def byte_detokenize(ids: Iterable[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


@lru_cache(maxsize=4)
def _ones(length: int) -> str:
    return json.dumps([1] * length, separators=(",", ":"))


def _record(block: list[int], positions: list[int] | None = None) -> str:
    """The seed's record as one JSON line (with position_ids when given); the same text json.dumps
    of the dict gives, with the ids encoded once for input_ids and labels."""
    ids = json.dumps(block, separators=(",", ":"))
    marks = "" if positions is None else f',"position_ids":{json.dumps(positions, separators=(",", ":"))}'
    return f'{{"input_ids":{ids},"attention_mask":{_ones(len(block))},"labels":{ids}{marks}}}\n'


def _open_output(path: Path, gz: bool) -> TextIO:
    return gzip.open(path, "wt", encoding="utf-8") if gz else path.open("w", encoding="utf-8")


def write_jsonl(blocks: Iterable[list[int]], path: str | Path) -> int:
    """Write blocks as the seed's records (gzip when the name ends in .gz); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with _open_output(path, path.name.endswith(".gz")) as f:
        for block in blocks:
            f.write(_record(block))
            count += 1
    return count


def is_validation(index: int, fraction: float, seed: int) -> bool:
    """Whether block `index` belongs to the validation split (see the module docstring)."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2**64


def _batches(documents: Iterable[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    chars = 0
    for doc in documents:
        batch.append(doc)
        chars += len(doc)
        if len(batch) == BATCH_DOCUMENTS or chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


@dataclass
class Summary:
    block_size: int
    vocab_size: int
    vocabulary: str  # where vocab_size comes from
    outputs: list[Path]  # train, then validation when split
    channels: bool = True  # outputs are the train (and validation) channels (--output-dir), not one file
    documents: int = 0
    tokens: int = 0
    blocks: list[int] = field(default_factory=lambda: [0, 0])  # train, validation
    stopped: bool = False  # at --max-blocks
    seconds: float = 0.0

    @property
    def left_over(self) -> int:
        """Tokens read but in no block: the last incomplete block (or what --max-blocks left)."""
        return self.tokens - sum(self.blocks) * self.block_size

    def line(self) -> str:
        # one --output file is no split: it is whichever channel the user makes it
        names = ("train ", "validation ") if self.channels else ("",)
        where = ", ".join(f"{name}{count} in {path}" for name, count, path in zip(names, self.blocks, self.outputs))
        why = "stopped at --max-blocks" if self.stopped else "the last incomplete block"
        return (f"wrote {sum(self.blocks)} blocks of {self.block_size} tokens ({where}) from "
                f"{self.documents} documents, {self.tokens} tokens; {self.left_over} tokens left "
                f"over ({why}); vocab_size {self.vocab_size} ({self.vocabulary}); "
                f"{self.tokens / max(self.seconds, 1e-9):,.0f} tokens/s")


def _targets(args: argparse.Namespace) -> list[Path]:
    """The output files, checked before anything is read or written."""
    if args.output is not None:
        option, targets = "--output", [Path(args.output)]
        if not args.output.endswith(OUTPUT_SUFFIXES):
            raise PackError(f"--output {args.output}: name a {' or '.join(OUTPUT_SUFFIXES)} file "
                            f"(the names a channel's loader reads)")
    else:
        option, root = "--output-dir", Path(args.output_dir)
        if root.exists() and not root.is_dir():
            raise PackError(f"--output-dir {root}: exists and is not a directory")
        targets = [root / "train" / "train.jsonl"]
        if args.validation_fraction is not None:
            targets.append(root / "validation" / "validation.jsonl")
    inputs = [Path(name).resolve() for name in args.input or ()]
    for target in targets:
        if target.is_dir():
            raise PackError(f"{option}: {target} is a directory")
        if target.exists():
            if not args.overwrite:
                raise PackError(f"{option}: {target} exists; pass --overwrite to replace it")
            resolved = target.resolve()
            read = next((p for p in inputs if p == resolved or p in resolved.parents), None)
            if read is not None:
                raise PackError(f"{option}: {target} would also be read as --input {read}; "
                                f"write the output elsewhere")
    return targets


@contextmanager
def _writing(targets: list[Path]) -> Iterator[list[TextIO]]:
    """Open files for `targets` as hidden temporaries; renamed into place when the block ends
    normally, removed (with the directories made for them) when it raises."""
    temps = [t.with_name(f".{t.name}.{os.getpid()}.tmp") for t in targets]
    made: list[Path] = []
    files: list[TextIO] = []
    try:
        for temp, target in zip(temps, targets):
            missing = [d for d in (temp.parent, *temp.parent.parents) if not d.exists()]
            for directory in reversed(missing):
                directory.mkdir()
                made.append(directory)
            files.append(_open_output(temp, target.name.endswith(".gz")))
        yield files
        for f in files:
            f.close()
        for temp, target in zip(temps, targets):
            os.replace(temp, target)
    except BaseException:
        for f in files:
            f.close()
        for temp in temps:
            temp.unlink(missing_ok=True)
        for directory in reversed(made):
            with suppress(OSError):  # not empty: someone else wrote there meanwhile
                directory.rmdir()
        raise


# Options that mean something only beside another one: given alone they are an error.
_NEEDS = {"validation_fraction": "output_dir", "seed": "validation_fraction", "eos": "tokenizer",
          "add_special_tokens": "tokenizer", "dataset_config": "dataset", "split": "dataset",
          "streaming": "dataset"}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _check_format(args: argparse.Namespace) -> None:
    """The options each format takes (see --format)."""
    if args.format in INDEXED:
        if args.output is not None:
            raise PackError(f"--format {args.format} writes a channel directory of shards: give --output-dir, not "
                            "--output")
        for option in ("block_size", "max_blocks", "position_ids"):
            if getattr(args, option) is not None:
                raise PackError(f"{_flag(option)} applies to --format jsonl: indexed shards keep whole documents "
                                f"with their boundaries, and the job cuts rows of its max_context_width")
    else:
        if args.block_size is None:
            raise PackError("--block-size is required with --format jsonl (the job's max_context_width)")
        if args.shard_tokens is not None:
            raise PackError("--shard-tokens applies to --format indexed and megatron")


def run(args: argparse.Namespace):
    """Pack as `args` (from parse_args) say; PackError for a bad input, option or output."""
    for option, needed in _NEEDS.items():
        if getattr(args, option) is not None and getattr(args, needed) is None:
            raise PackError(f"{_flag(option)} applies only with {_flag(needed)}")
    _check_format(args)
    targets = pack_indexed.targets(args) if args.format in INDEXED else _targets(args)
    show_progress = not args.quiet and sys.stderr.isatty()
    if args.input:
        documents = file_documents(args.input, args.text_field)
    encode: Encode = byte_encode
    vocab_size, vocabulary = 256, "UTF-8 bytes"
    identity = {"name": "UTF-8 bytes", "vocabulary_sha256": None}
    if args.tokenizer:
        tokenizer = load_tokenizer(args.tokenizer)
        encode = tokenizer_encode(tokenizer, args.add_special_tokens, bool(args.eos))
        vocab_size, vocabulary = len(tokenizer), f"len(tokenizer) of {args.tokenizer}"
        identity = {"name": args.tokenizer, "vocabulary_sha256": vocabulary_sha256(tokenizer.get_vocab())}
    if args.dataset:  # after the tokenizer: a bad tokenizer should not wait for a download
        if not show_progress:
            import datasets

            datasets.disable_progress_bars()
        documents = dataset_documents(args.dataset, config=args.dataset_config, split=args.split or "train",
                                      streaming=bool(args.streaming), text_field=args.text_field)
    limited = islice(documents, args.max_documents) if args.max_documents is not None else documents

    def done(count: int) -> float | None:
        """The share of the input read so far, where it is known."""
        if args.max_documents is not None:
            return count / args.max_documents
        return documents.done / documents.total if documents.total else None

    with _progress(show_progress, done) as update:
        token_lists = _token_lists(limited, encode, update)
        if args.format in INDEXED:
            return pack_indexed.pack(args, targets, token_lists, vocab_size, vocabulary, identity, is_validation)
        return _pack(args, targets, token_lists, Summary(args.block_size, vocab_size, vocabulary, targets,
                                                         channels=args.output_dir is not None))


@dataclass
class _Counts:
    documents: int = 0
    tokens: int = 0


def _token_lists(documents: Iterable[str], encode: Encode, update: Callable[[int, int], None]) -> Iterator[list[int]]:
    """Each document's tokens, in order, encoded in batches; `update(documents, tokens)` after each.

    A pipeline of two: batch k+1 is encoded on a worker thread while this thread hands out batch
    k's tokens (to the writer) and reads the documents of batch k+2. A fast tokenizer releases the
    GIL and spreads a batch over every core, so reading, encoding and writing overlap instead of
    taking turns (bench/pack_throughput.py)."""
    counts = _Counts()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode") as pool:
        pending = None
        for batch in _batches(documents):
            submitted = pool.submit(encode, batch)
            if pending is not None:
                yield from _taken(pending.result(), counts, update)
            pending = submitted
        if pending is not None:
            yield from _taken(pending.result(), counts, update)


def _taken(token_lists: list[list[int]], counts: _Counts, update: Callable[[int, int], None]) -> Iterator[list[int]]:
    for ids in token_lists:
        counts.documents += 1  # counted as they are taken: exact when packing stops early
        counts.tokens += len(ids)
        yield ids
    update(counts.documents, counts.tokens)


@contextmanager
def _progress(show: bool, done: Callable[[int], float | None]) -> Iterator[Callable[[int, int], None]]:
    """A progress line on stderr (documents, tokens/s, and the time left where `done(documents)`
    knows the share read); the update function it yields is called after each batch."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    start = time.perf_counter()
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                        console=Console(stderr=True), disable=not show)

    def update(count: int, tokens: int) -> None:
        seconds = max(time.perf_counter() - start, 1e-9)
        line = f"{count:,} documents ({count / seconds:,.0f}/s), {tokens:,} tokens ({tokens / seconds:,.0f}/s)"
        share = done(count)
        if share:
            left = seconds * (1 - share) / share
            line += f", {100 * share:.0f}%, about {left // 60:.0f} min {left % 60:02.0f} s left"
        progress.update(task, description=line)

    with progress:
        task = progress.add_task("packing")
        yield update


def _pack(args: argparse.Namespace, targets: list[Path], token_lists: Iterable[list[int]],
          summary: Summary) -> Summary:
    start = time.perf_counter()
    fraction, seed = args.validation_fraction, args.seed or 0
    with _writing(targets) as files:
        counted = pack_indexed.counted(token_lists, summary)
        for index, (block, positions) in enumerate(group_documents(counted, args.block_size)):
            split = int(fraction is not None and is_validation(index, fraction, seed))
            files[split].write(_record(block, positions if args.position_ids is not False else None))
            summary.blocks[split] += 1
            if index + 1 == args.max_blocks:
                summary.stopped = True
                break
        # A channel without records fails the job that reads it: better no files at all.
        if not sum(summary.blocks):
            raise PackError(f"no complete block: {summary.documents} documents gave {summary.tokens} "
                            f"tokens, fewer than --block-size {args.block_size}; give more input or a "
                            f"smaller --block-size")
        if fraction is not None and not all(summary.blocks):
            train, validation = summary.blocks
            raise PackError(f"--validation-fraction {fraction} (--seed {seed}) split the "
                            f"{train + validation} blocks into train {train}, validation {validation}; "
                            f"each needs one at least: give more input or another fraction")
    summary.seconds = time.perf_counter() - start
    return summary


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not in (0, 1): give the share of blocks that "
                                         f"validate, e.g. 0.01")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, as every other error of the command
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv: Sequence[str] | None = None,
               prog: str = "python -m container.data.packing") -> argparse.Namespace:
    p = _Parser(prog=prog, description="Pack documents for a job's channels: fixed-length token blocks as JSON "
                                       "Lines (--format jsonl) or indexed token shards of whole documents "
                                       "(--format indexed); see the module docstrings of container.data.packing "
                                       "and container.data.pack_indexed.")
    source = p.add_argument_group("documents").add_mutually_exclusive_group(required=True)
    source.add_argument("--input", nargs="+", metavar="PATH",
                        help="files or directories; a directory gives its .txt/.md/.rst/.py files (one "
                             "document each) and its .jsonl/.jsonl.gz/.parquet files (one per record), "
                             "at any depth, in sorted name order; a named .json/.json.gz file is JSON "
                             "Lines, a named file of another kind is text")
    source.add_argument("--dataset", metavar="NAME_OR_PATH",
                        help="a datasets dataset: a Hub id, a directory load_dataset reads (e.g. of "
                             "jsonl or parquet files) or a save_to_disk directory")
    d = p.add_argument_group("document options")
    d.add_argument("--text-field", default="text", metavar="NAME",
                   help="the field (column) of JSON Lines, Parquet and dataset records that holds the text "
                        "(default: text)")
    d.add_argument("--dataset-config", metavar="NAME",
                   help="the dataset's configuration (load_dataset's name)")
    d.add_argument("--split", metavar="NAME", help="the dataset's split (default: train)")
    d.add_argument("--streaming", action="store_true", default=None,
                   help="stream the dataset instead of preparing it in the datasets cache first "
                        "(a save_to_disk directory is memory-mapped either way)")
    d.add_argument("--max-documents", type=_positive, metavar="N", help="read at most N documents")
    t = p.add_argument_group("tokens")
    t.add_argument("--tokenizer", metavar="NAME_OR_DIR",
                   help="a fast transformers tokenizer: a local directory or a Hub model id "
                        "(default: UTF-8 bytes, vocab_size 256)")
    t.add_argument("--add-special-tokens", action=argparse.BooleanOptionalAction, default=None,
                   help="add the tokenizer's special tokens to every document, e.g. Llama 3's BOS "
                        "(default: what the tokenizer does by default)")
    t.add_argument("--eos", action="store_true", default=None,
                   help="append the tokenizer's eos_token after every document")
    t.add_argument("--block-size", type=_positive, metavar="N",
                   help="tokens per block (= the job's max_context_width); --format jsonl only: indexed shards "
                        "keep whole documents, and the job cuts its rows")
    t.add_argument("--max-blocks", type=_positive, metavar="N",
                   help="stop after N blocks (train and validation; --format jsonl)")
    t.add_argument("--position-ids", action=argparse.BooleanOptionalAction, default=None,
                   help="write each block's position_ids, 0 at each document's start, so the job trains "
                        "every document on its own (document masking, docs/data.md; default); "
                        "--no-position-ids: the seed's records, whose documents see each other (--format jsonl)")
    o = p.add_argument_group("output")
    o.add_argument("--format", choices=FORMATS, default="jsonl",
                   help="jsonl: fixed-length blocks as JSON Lines records (default); indexed: memory-mapped "
                        "token shards of whole documents (a job reads them with dataset_type: indexed, "
                        "shuffled, resumable anywhere: container.data.pack_indexed); megatron: the same as "
                        "Megatron-Core .bin/.idx pairs, which its IndexedDataset reads too "
                        "(container.data.megatron_writer)")
    o.add_argument("--shard-tokens", type=_positive, metavar="N",
                   help=f"tokens per shard (--format indexed, megatron; default {DEFAULT_SHARD_TOKENS:,})")
    out = o.add_mutually_exclusive_group(required=True)
    out.add_argument("--output", metavar="FILE", help="one .jsonl or .jsonl.gz file (--format jsonl)")
    out.add_argument("--output-dir", metavar="DIR",
                     help="the job's channels: --format jsonl writes DIR/train/train.jsonl (and "
                          "DIR/validation/validation.jsonl); --format indexed writes the shards "
                          "DIR/train/train-00000.{bin,idx}, ... (and DIR/validation/validation-00000.{bin,idx}, ...)")
    o.add_argument("--validation-fraction", type=_fraction, metavar="F",
                   help="send about F (0 < F < 1) of the blocks (--format indexed: of the documents) to "
                        "DIR/validation (with --output-dir)")
    o.add_argument("--seed", type=int, metavar="N", help="which blocks (or documents) validate (default: 0)")
    o.add_argument("--overwrite", action="store_true", help="replace output files that exist")
    o.add_argument("--quiet", action="store_true",
                   help="no progress display (there is none off a terminal)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None, prog: str = "python -m container.data.packing") -> int:
    args = parse_args(argv, prog)
    try:
        summary = run(args)
    except PackError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    print(summary.line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
