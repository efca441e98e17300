"""Making data sets (container.data.packing): the blocks equal a reference computed here with
transformers' own AutoTokenizer and the seed's group_texts, for every kind of input; the
train/validation split; the summary; bad inputs that fail with one line and leave nothing.
Here the tests that start processes; the rest are tests/unit/test_pack.py."""

import os
import pty
import subprocess
import sys
from pathlib import Path

from tests.support.pack import DOCS, blocks, reference, summary, write_docs

ROOT = Path(__file__).resolve().parents[2]


# --- the seed's group_texts, byte tokens ----------------------------------------------------


def test_python_m_container_data_pack_still_works(tmp_path):
    write_docs(tmp_path / "src", ["a" * 10])
    result = subprocess.run(
        [sys.executable, "-m", "container.data", "pack", "--input", str(tmp_path / "src"),
         "--output", str(tmp_path / "out.jsonl"), "--block-size", "3", "--max-blocks", "2"],
        capture_output=True, text=True, cwd=ROOT, check=True)
    assert "wrote 2 blocks" in result.stdout
    assert len(blocks(tmp_path / "out.jsonl")) == 2


# --- a model's tokenizer: every kind of input equals the reference --------------------------


def test_end_to_end_on_the_command_line(tmp_path, tokenizer_dir):
    """No "sequence length is longer than the maximum" warning although documents exceed
    model_max_length (8); train + validation files a job reads as its channels."""
    src = write_docs(tmp_path / "docs", DOCS)
    result = subprocess.run(
        [sys.executable, "-m", "container.data.packing", "--input", str(src), "--tokenizer", str(tokenizer_dir),
         "--output-dir", str(tmp_path / "data"), "--validation-fraction", "0.25", "--block-size", "4"],
        capture_output=True, text=True, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr
    assert "longer than the specified maximum" not in result.stderr
    train = blocks(tmp_path / "data/train/train.jsonl")
    validation = blocks(tmp_path / "data/validation/validation.jsonl")
    assert sorted(train + validation) == sorted(reference(tokenizer_dir, DOCS, 4)[0])
    s = summary(result.stdout)
    assert s["where"] == (f"train {len(train)} in {tmp_path / 'data/train/train.jsonl'}, validation "
                          f"{len(validation)} in {tmp_path / 'data/validation/validation.jsonl'}")


def test_progress_on_a_terminal_only(tmp_path):
    src = write_docs(tmp_path / "docs", DOCS)

    def stderr_on_a_terminal(*extra) -> str:
        controller, terminal = pty.openpty()
        proc = subprocess.Popen([sys.executable, "-m", "container.data.packing", "--input", str(src), "--output",
                                 str(tmp_path / "out.jsonl"), "--block-size", "8", "--overwrite", *extra],
                                stdout=subprocess.DEVNULL, stderr=terminal, cwd=ROOT)
        os.close(terminal)
        chunks = []
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(controller)
        assert proc.wait() == 0
        return b"".join(chunks).decode(errors="replace")

    shown = stderr_on_a_terminal()
    assert f"{len(DOCS)} documents (" in shown and "tokens (" in shown and "/s)" in shown
    assert stderr_on_a_terminal("--quiet") == ""


# --- the validation split -----------------------------------------------------------------


# --- bad inputs: one line, exit 2, nothing written ---------------------------------------------


