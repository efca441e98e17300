"""The document kernels on CPU: each kernel's plan, by hand, and each kernel's attention equal to
every document attended alone, in one process and as context-parallel ranks (their queries
against the whole keys, as the all-gather path hands them over). FlexAttention runs its eager
reference here (forward only: PyTorch has no FlexAttention backward on CPU); varlen's plan runs
through a CPU stand-in of flash attention's variable-length call. The compiled kernels on a GPU,
with gradients: tests/integration/test_document_kernels.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from container.models import attention
from container.models.document_kernels import DenseKernel, FlexKernel, VarlenKernel, build, varlen_plan
from tests.support.document_kernels import (
    assert_attention_close,
    attend_as_cp_ranks,
    attention_tolerance,
    documents_alone,
    random_documents,
)

# The eager FlexAttention here is on purpose (the reference, forward only); its advice to compile is not for this test.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
# fp32: the kernels and the reference add the same terms in other orders, within
# tests/support/document_kernels.attention_tolerance; a control (attention across the documents,
# or without the window) is more than 100 times that off.
CONTROL = 100


def varlen_on_cpu(q, k, v, cu_q, cu_k, max_q, max_k, window_size):
    """Flash attention's variable-length call, one segment at a time with SDPA (bottom-right
    causal, as flash aligns a segment's queries with the end of its keys; a window (left, 0) lets
    a query see `left` keys before its own, as flash attention documents it)."""
    left, right = window_size
    assert right == 0 and left >= -1
    out = torch.empty_like(q)
    for i in range(len(cu_q) - 1):
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        q_len, k_len = qs.stop - qs.start, ks.stop - ks.start
        assert q_len <= max_q and k_len <= max_k
        allowed = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
        if left >= 0:
            allowed &= ~torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len - left - 1)
        out[qs] = F.scaled_dot_product_attention(q[qs].transpose(0, 1), k[ks].transpose(0, 1), v[ks].transpose(0, 1),
                                                 attn_mask=allowed, enable_gqa=k.shape[1] != q.shape[1]).transpose(0, 1)
    return out


def cpu_varlen_kernel() -> VarlenKernel:
    kernel = VarlenKernel()
    kernel._attn, kernel._gqa = varlen_on_cpu, False
    return kernel


KERNELS = {"dense": DenseKernel, "flex": lambda: FlexKernel(compiled=False), "varlen": cpu_varlen_kernel}


def qkv(batch=3, seq=48, heads=4, kv_heads=2, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, h, seq, dim, generator=g) for h in (heads, kv_heads, kv_heads)]


def test_the_dense_plan_is_the_rule():
    mask = DenseKernel().plan(torch.tensor([[0, 0, 1, 1, 1]]))
    assert mask.shape == (1, 1, 5, 5)
    assert mask[0, 0].int().tolist() == [[1, 0, 0, 0, 0],
                                         [1, 1, 0, 0, 0],
                                         [0, 0, 1, 0, 0],
                                         [0, 0, 1, 1, 0],
                                         [0, 0, 1, 1, 1]]
    # a context-parallel rank's queries (positions 1 and 4) against all five keys
    assert DenseKernel().plan(torch.tensor([[0, 0, 1, 1, 1]]), torch.tensor([1, 4]))[0, 0].int().tolist() == [
        [1, 1, 0, 0, 0], [0, 0, 1, 1, 1]]


def test_the_varlen_plan_by_hand():
    docs = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2], [0, 0, 0, 0, 0, 0, 0, 0]])
    whole = varlen_plan(docs)  # one process: a segment is a document, its keys its own tokens
    assert whole.cu_q.tolist() == whole.cu_k.tolist() == [0, 3, 7, 8, 16]
    assert (whole.max_q, whole.max_k, whole.key_index) == (8, 8, None)
    # cp 2, rank 0 keeps positions 0, 1 (chunk 0) and 6, 7 (chunk 3) of each row:
    # row 0: [doc 0: q 0-1, keys 0-1], [doc 1: q 6, keys 3-6], [doc 2: q 7, key 7];
    # row 1: [doc 0: q 0-1, keys 0-1], [doc 0 again after the jump: q 6-7, keys 0-7]
    plan = varlen_plan(docs, torch.tensor([0, 1, 6, 7]))
    assert plan.cu_q.tolist() == [0, 2, 3, 4, 6, 8]
    assert plan.cu_k.tolist() == [0, 2, 6, 7, 9, 17]
    assert plan.key_index.tolist() == [0, 1, 3, 4, 5, 6, 7, 8, 9, 8, 9, 10, 11, 12, 13, 14, 15]
    assert (plan.max_q, plan.max_k) == (2, 8)


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("cp", [1, 2, 3])
def test_each_kernel_attends_as_the_documents_alone(name, cp):
    q, k, v = qkv()
    docs = random_documents(3, 48, per_row=5)
    docs[1] = 0  # a row that is one document
    want = documents_alone(q, k, v, docs)
    got = attend_as_cp_ranks(KERNELS[name](), q, k, v, docs, cp)
    assert_attention_close(got, want, (q, k, v), what=f"{name}, cp {cp}")
    # the control: causal attention over the whole rows is far off
    crossing = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert (crossing - want).abs().max() > CONTROL * attention_tolerance((q, k, v))


@pytest.mark.parametrize("name", ["dense", "varlen"])
def test_gradients_through_the_cp_plans_are_the_documents_alone(name):
    """Under context parallelism the keys a rank's segments share are read twice (varlen's
    key_index): their gradients must add up, as the all-gather's backward then sums them over
    ranks."""
    q, k, v = (t.requires_grad_() for t in qkv(batch=2, seq=32))
    docs = random_documents(2, 32, per_row=3, seed=1)
    grad = torch.randn_like(q)
    documents_alone(q, k, v, docs).backward(grad)
    want = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    attend_as_cp_ranks(KERNELS[name](), q, k, v, docs, cp=2).backward(grad)
    for label, got, ref, power in zip("qkv", (q.grad, k.grad, v.grad), want, (3, 3, 1)):
        assert_attention_close(got, ref, (q, k, v, grad), power, what=f"{name}: d{label}")


def test_the_seam_attends_with_the_kernel_in_use():
    q, k, v = qkv(batch=1, seq=12)
    docs = torch.tensor([[0] * 5 + [1] * 7])
    previous = attention.use_kernel(FlexKernel(compiled=False))
    try:
        plan = attention.mask_for(docs)
        assert type(plan).__name__ == "BlockMask"
        got = attention.sdpa(q, k, v, plan)
    finally:
        attention.use_kernel(previous)
    assert isinstance(attention.kernel(), DenseKernel)
    assert_attention_close(got, documents_alone(q, k, v, docs), (q, k, v))


def test_auto_is_dense_on_cpu_and_gpu_kernels_are_refused_there():
    cpu = torch.device("cpu")
    assert isinstance(build("auto", cpu, bf16=False), DenseKernel)
    assert isinstance(build("dense", cpu, bf16=True), DenseKernel)
    with pytest.raises(ValueError, match=r"attention_kernel flex: FlexAttention has no backward pass on CPU.*"
                                         r"Fix: use attention_kernel: auto"):
        build("flex", cpu, bf16=False)
    with pytest.raises(ValueError, match=r"attention_kernel varlen: flash attention runs on NVIDIA GPUs only"):
        build("varlen", cpu, bf16=True)


def test_varlen_needs_half_precision():
    from launcher.wire.training.models import attention_kernel_problem as problem

    assert problem("varlen", bf16=True, gpu=True) is None
    assert "half precision only" in problem("varlen", bf16=False, gpu=True)[0]
    assert problem("flex", bf16=False, gpu=True) is None
    assert problem("flex", bf16=False, gpu=None) is None  # local_gpu: the container checks


def test_rows_that_are_one_document_each_take_the_causal_kernels():
    """A batch whose every row is one document (ids all 0) is causal attention exactly: the seam
    plans nothing, so SDPA's causal kernels (flash, cuDNN; TE's under context parallelism) run."""
    assert attention.mask_for(torch.zeros(2, 16, dtype=torch.long)) is None
    two = torch.zeros(2, 16, dtype=torch.long)
    two[1, 9:] = 1  # the control: one row of two documents needs the plan
    assert attention.mask_for(two).shape == (2, 1, 16, 16)


def _blocks(count: torch.Tensor, indices: torch.Tensor, kv_blocks: int) -> torch.Tensor:
    """A BlockMask's (count, indices) per query block -> [B, H, Qb, Kb] booleans."""
    kept = torch.arange(indices.shape[-1]) < count[..., None]
    dense = torch.zeros(*indices.shape[:-1], kv_blocks, dtype=torch.bool)
    return dense.scatter_(-1, indices.long(), kept) if indices.numel() else dense


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_flex_blocks_from_the_documents_are_create_block_masks(cp):
    """The blocks FlexKernel finds from the documents' extents against torch's create_block_mask,
    which evaluates the rule on every pair (8-token blocks, so a 96-token row has 12 x 12): the
    same full blocks, and every block with a visible pair kept. cp 1-3 cut the rows at block
    boundaries, where the two are equal; cp 4's 12-token chunks are not, where partial blocks may
    be kept that torch drops (the rule then masks each pair)."""
    from torch.nn.attention.flex_attention import create_block_mask

    from container.distributed.context_parallel import positions

    docs = random_documents(3, 96, per_row=6, seed=2)
    docs[1] = 0  # one long document: whole blocks, full
    docs[2, :40], docs[2, 40:] = 0, 1
    for rank in range(cp):
        pos = positions(96, cp, rank) if cp > 1 else torch.arange(96)
        ours = FlexKernel(compiled=False, block=8).plan(docs, pos if cp > 1 else None)

        def rule(b, h, q, kv, pos=pos):
            return (docs[b, pos[q]] == docs[b, kv]) & (pos[q] >= kv)

        torch_mask = create_block_mask(rule, 3, None, pos.numel(), 96, device="cpu", BLOCK_SIZE=8)
        kb = 96 // 8
        our_full = _blocks(ours.full_kv_num_blocks, ours.full_kv_indices, kb)
        their_full = _blocks(torch_mask.full_kv_num_blocks, torch_mask.full_kv_indices, kb)
        our_kept = _blocks(ours.kv_num_blocks, ours.kv_indices, kb) | our_full
        their_kept = _blocks(torch_mask.kv_num_blocks, torch_mask.kv_indices, kb) | their_full
        assert torch.equal(our_full, their_full)
        assert not (their_kept & ~our_kept).any()  # never a visible block skipped
        if cp < 4:
            assert torch.equal(our_kept, their_kept)
        assert their_full.any() and (~their_kept).any()  # the control: the rows have both kinds


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("cp", [1, 2, 3])
@pytest.mark.parametrize("window", [1, 5, 16])
def test_each_kernel_keeps_a_sliding_window_within_the_documents(name, cp, window):
    """Mistral's sliding window: each query sees itself and the window - 1 keys before it, within
    its document, as every document attended alone with transformers' sliding-window mask."""
    q, k, v = qkv()
    docs = random_documents(3, 48, per_row=4, seed=3)
    docs[1] = 0  # one document the window cuts many times
    want = documents_alone(q, k, v, docs, window)
    got = attend_as_cp_ranks(KERNELS[name](), q, k, v, docs, cp, window)
    assert_attention_close(got, want, (q, k, v), what=f"{name}, cp {cp}, window {window}")
    assert (documents_alone(q, k, v, docs) - want).abs().max() > CONTROL * attention_tolerance((q, k, v))


def test_flex_blocks_under_a_window_keep_every_visible_block():
    """The blocks FlexKernel finds with a window against create_block_mask of the same rule:
    never a block with a visible pair skipped, the same full blocks, and the far blocks dropped."""
    from torch.nn.attention.flex_attention import create_block_mask

    docs = torch.zeros(2, 96, dtype=torch.long)
    docs[1, 50:] = 1
    ours = FlexKernel(compiled=False, block=8).plan(docs, window=20)

    def rule(b, h, q, kv):
        return (docs[b, q] == docs[b, kv]) & (q >= kv) & (q - kv < 20)

    theirs = create_block_mask(rule, 2, None, 96, 96, device="cpu", BLOCK_SIZE=8)
    full = [_blocks(m.full_kv_num_blocks, m.full_kv_indices, 12) for m in (ours, theirs)]
    kept = [_blocks(m.kv_num_blocks, m.kv_indices, 12) | f for m, f in zip((ours, theirs), full)]
    assert torch.equal(full[0], full[1]) and not (kept[1] & ~kept[0]).any()
    assert torch.equal(kept[0], kept[1])
    assert not kept[0][0, 0, 11, :8].any()  # the last query block sees none of the first 64 keys


def test_the_seam_applies_a_window_to_rows_without_documents():
    """Rows of one document each take the job's kernel with a window plan made once per shape,
    as the documents' path would; a window as long as the rows is the causal kernels'."""
    q, k, v = qkv(batch=2, seq=40)
    want = documents_alone(q, k, v, torch.zeros(2, 40, dtype=torch.long), 12)
    assert_attention_close(attention.sdpa(q, k, v, window=12), want, (q, k, v))
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(attention.sdpa(q, k, v, window=40), causal)
    assert attention.mask_for(None, 12) is None and attention.mask_for(torch.zeros(2, 40, dtype=torch.long), 12) is None
    docs = random_documents(2, 40, per_row=3, seed=4)
    got = attention.sdpa(q, k, v, attention.mask_for(docs, 12))
    assert_attention_close(got, documents_alone(q, k, v, docs, 12), (q, k, v))
