"""A minimal SMP v1 training script for configs/seed/mics-sdp2.yaml: sharded data parallelism needs
no change to the model, only SMP's wrappers (it runs where SMP v1 is installed: the PyTorch DLCs
1.6.0 to 2.0.0 for GPUs)."""

import smdistributed.modelparallel.torch as smp
import torch


@smp.step
def train_step(model, inputs, targets):
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    model.backward(loss)
    return loss


def main():
    smp.init()
    torch.cuda.set_device(smp.local_rank())
    torch.manual_seed(smp.dp_rank())
    model = smp.DistributedModel(torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                                     torch.nn.Linear(4096, 1024)))
    optimizer = smp.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-4))
    for step in range(1, 101):
        inputs = torch.randn(8, 1024, device="cuda")
        optimizer.zero_grad(set_to_none=True)
        loss = train_step(model, inputs, inputs).reduce_mean()
        optimizer.step()
        if smp.rank() == 0 and step % 10 == 0:
            print(f"step {step} loss: {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
