"""The document kernels compiled on a GPU (FlexAttention's fused kernels, flash attention's
variable-length kernel, SDPA with the dense mask): output and q/k/v gradients equal every
document attended alone, in one process and as context-parallel ranks; FlexAttention's block
masks compile once for every batch's documents; sliding windows (Mistral's) are kept by each;
a packed row of a Llama trains as its documents alone. Integration, not unit: torch.compile
starts compile worker processes. Skipped without CUDA; the CPU half (plans by hand, forward
through every kernel): tests/unit/test_document_kernels.py."""

from __future__ import annotations

import pytest
import torch

from container.data.loader import shift_labels
from container.loss import token_loss_sum
from container.models import attention
from container.models.document_kernels import build
from container.models.llama import build_model
from launcher.wire.training.models import PRESETS
from tests.support.document_kernels import attend_as_cp_ranks, documents_alone, random_documents

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the compiled kernels)")]

CUDA = torch.device("cuda")
# Norm-wise relative error bounds from the precision's unit roundoff u. fp32 (u = 2^-24): the
# kernels and the reference add the same terms in other orders over softmaxes of up to 2048
# keys: 1e-5 (~170 u), the masking tests' bound. bf16 (u = 2^-8): inputs are the same bf16
# numbers for both sides and the reference runs in fp64, so the error is the kernel's own
# roundings (P rounded to bf16 before P.V, the output rounded): a few u; 4u = 2^-6 bounds it.
BOUND = {torch.float32: 1e-5, torch.bfloat16: 2.0**-6}
CASES = [("flex", torch.float32), ("flex", torch.bfloat16), ("varlen", torch.bfloat16), ("dense", torch.float32)]


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Norm-wise, over the whole output or gradient (against an fp64 reference of the same inputs)."""
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def qkv(dtype, batch=2, seq=2048, heads=8, kv_heads=2, dim=64, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(batch, h, seq, dim, generator=g, device=CUDA).to(dtype).requires_grad_()
            for h in (heads, kv_heads, kv_heads)]


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize(("name", "dtype"), CASES, ids=[f"{n}-{str(d)[6:]}" for n, d in CASES])
def test_compiled_kernels_attend_as_the_documents_alone(name, dtype, cp):
    q, k, v = qkv(dtype)
    docs = random_documents(2, 2048, per_row=9).to(CUDA)
    grad = torch.randn_like(q)
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = documents_alone(*exact, docs)
    want.backward(grad.double())
    kernel = build(name, CUDA, bf16=dtype == torch.bfloat16)
    got = attend_as_cp_ranks(kernel, q, k, v, docs, cp)
    got.backward(grad)
    bound = BOUND[dtype]
    assert relative_error(got, want) <= bound
    for name_, ours, ref in zip("qkv", (q.grad, k.grad, v.grad), (t.grad for t in exact)):
        assert relative_error(ours, ref) <= bound, f"d{name_}"
    # the control: causal attention over the whole rows is far outside the bound
    crossing = torch.nn.functional.scaled_dot_product_attention(*exact, is_causal=True, enable_gqa=True)
    assert relative_error(crossing, want) > 10 * bound


@pytest.mark.parametrize("cp", [1, 2])
@pytest.mark.parametrize(("name", "dtype"), CASES, ids=[f"{n}-{str(d)[6:]}" for n, d in CASES])
def test_compiled_kernels_keep_a_sliding_window(name, dtype, cp):
    """Mistral's window (here 300 tokens, across FlexAttention's 128-token blocks and the cp
    chunks) within the documents: output and gradients equal each document attended alone with
    transformers' sliding-window mask; varlen's is flash attention's window_size (W - 1, 0)."""
    q, k, v = qkv(dtype)
    docs = random_documents(2, 2048, per_row=3, seed=5).to(CUDA)
    grad = torch.randn_like(q)
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = documents_alone(*exact, docs, 300)
    want.backward(grad.double())
    got = attend_as_cp_ranks(build(name, CUDA, bf16=dtype == torch.bfloat16), q, k, v, docs, cp, 300)
    got.backward(grad)
    bound = BOUND[dtype]
    assert relative_error(got, want) <= bound
    for name_, ours, ref in zip("qkv", (q.grad, k.grad, v.grad), (t.grad for t in exact)):
        assert relative_error(ours, ref) <= bound, f"d{name_}"
    assert relative_error(documents_alone(*exact, docs), want) > 10 * bound  # the control


def test_flex_block_masks_compile_once_for_every_batch():
    """Each batch's documents differ; were they compiled into the block mask's graph, every step
    would recompile (and after dynamo's cache limit fall back to eager, materialising S^2)."""
    from torch._dynamo.utils import counters

    kernel = build("flex", CUDA, bf16=True)
    q, k, v = (t.detach() for t in qkv(torch.bfloat16, seq=1024))
    kernel.attend(q, k, v, kernel.plan(random_documents(2, 1024, per_row=4, seed=0).to(CUDA)))
    graphs = counters["stats"]["unique_graphs"]
    for seed in range(1, 5):
        docs = random_documents(2, 1024, per_row=3 + seed, seed=seed).to(CUDA)
        out = kernel.attend(q, k, v, kernel.plan(docs))
        assert relative_error(out, documents_alone(q.double(), k.double(), v.double(), docs)) <= 2.0**-6
    assert counters["stats"]["unique_graphs"] == graphs


def test_a_packed_llama_row_trains_as_its_documents_alone_with_flex():
    """llama3-tiny in fp32 on the GPU: the loss and every gradient of a packed batch (two rows of
    documents) equal those of the documents run alone, through FlexAttention's compiled kernel."""
    spec = PRESETS["llama3-tiny"]
    lengths = ((5, 40, 83), (128,), (64, 1, 63))
    torch.manual_seed(0)
    model = build_model(spec, 128, device=CUDA)
    model.init_weights()
    g = torch.Generator().manual_seed(1)
    rows = [[torch.randint(0, spec.vocab_size, (n,), generator=g) for n in row] for row in lengths]
    ids = torch.stack([torch.cat(row) for row in rows]).to(CUDA)
    positions = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in lengths]).to(CUDA)
    labels = shift_labels(ids)
    labels[:, :-1][positions[:, 1:] == 0] = -100
    documents = (positions == 0).cumsum(1) - 1
    batch = {"input_ids": ids, "labels": labels, "positions": positions, "documents": documents}

    def loss_and_grads(run):
        model.zero_grad(set_to_none=True)
        loss, tokens = run()
        (loss / tokens).backward()
        return (loss / tokens).item(), {n: p.grad.clone() for n, p in model.named_parameters()}

    def alone():
        total, tokens = 0.0, 0
        for row in rows:
            for doc in row:
                seq = doc[None].to(CUDA)
                loss, n = model(seq, labels=shift_labels(seq))
                total, tokens = total + loss, tokens + n
        return total, tokens

    previous = attention.use_kernel(build("flex", CUDA, bf16=False))
    try:
        packed_loss, packed_grads = loss_and_grads(lambda: token_loss_sum(model, batch))
    finally:
        attention.use_kernel(previous)
    alone_loss, alone_grads = loss_and_grads(alone)
    assert packed_loss == pytest.approx(alone_loss, rel=1e-5)
    for name, grad in alone_grads.items():
        assert relative_error(packed_grads[name], grad) <= 1e-5, name
