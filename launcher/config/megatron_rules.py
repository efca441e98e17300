"""A Megatron-Core corpus (launcher.wire.megatron_index) in a local indexed channel, checked at
validate: what it is (a note naming the format), that the job says which vocabulary its ids are of
(the files do not), and its token ids against the model's vocabulary (read from the .bin, which
the files' headers do not record).
"""

from __future__ import annotations

from launcher.config.job import JobConfig
from launcher.wire.megatron_index import MegatronHeader, token_range
from launcher.wire.training.issues import Issue
from launcher.wire.training.models import ModelSpec

HP = "hyperparameters"
_GIVEN = ("tokenizer", "hf_pretrained_model_name_or_dir", "vocab_size")


def megatron_issues(field: str, header: MegatronHeader, spec: ModelSpec) -> list[Issue]:
    """The format as a note, and the corpus's ids within [0, the model's vocabulary)."""
    # the directory as the value (a long one is shortened on screen), the file named in the note
    issues = [Issue(field, str(header.idx.parent), f"{header.idx.name}: {header.describe()}", level="info")]
    if header.dtype.startswith("uint") and 2 ** (8 * header.itemsize) <= spec.vocab_size:
        return issues  # every id its dtype holds is in the vocabulary: nothing to read
    low, high = token_range(header)
    if low < 0 or high >= spec.vocab_size:
        bad = low if low < 0 else high
        issues.append(Issue(field, str(header.idx), f"{header.bin.name} holds token id {bad:,}, outside "
                                                    f"{spec.name}'s vocabulary [0, {spec.vocab_size:,})",
                            "train a model of the corpus's vocabulary (vocab_size, or the tokenizer it was made "
                            "with), or tokenize the corpus with the model's tokenizer"))
    return issues


def vocabulary_given(field: str, job: JobConfig) -> list[Issue]:
    """A Megatron corpus's ids mean the tokens of the tokenizer it was made with, which its files do
    not record: the job must name it (or at least the vocabulary's size), not leave a preset's."""
    hp = job.hyperparameters
    if any(getattr(hp, key, None) for key in _GIVEN):
        return []
    return [Issue(f"{HP}.tokenizer", None, f"{field} holds a Megatron MMIDIDX corpus, which records neither the "
                                           "tokenizer it was made with nor its vocabulary size",
                  "set hyperparameters.tokenizer (or hf_pretrained_model_name_or_dir) to the tokenizer the corpus "
                  "was made with, or at least vocab_size")]
