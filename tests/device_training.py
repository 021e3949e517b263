"""One training run on a device, for the GPU tests (CUDA) and the sim tests (``sim:0``): DDP
through the pyring backend, the drop-in optimizer, the compressed DDP hooks and OneBitAdam,
each on its own model, so that their results can be compared with the same run on the CPU."""

from __future__ import annotations

import torch


def _batches(rank: int, n: int) -> list:
    g = torch.Generator().manual_seed(rank)
    return [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)) for _ in range(n)]


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _params(net: torch.nn.Module) -> list:
    return [p.detach().cpu().numpy() for p in net.parameters()]


def training_body(rank, world, store, device, steps=4):
    """{run name: final parameters as numpy arrays} of each way of training on ``device``, and
    under "how" the communicator's device transport and the bytes its device links sent."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import pyring

    if device.startswith("sim"):
        from pyring.testing import sim_torch

        sim_torch.enable()
    dev = torch.device(device)
    data = [(x.to(dev), y.to(dev)) for x, y in _batches(rank, steps)]
    out = {}
    dist.init_process_group("pyring", store=store, rank=rank, world_size=world)
    hooks = {"ddp": (None, None), "ddp-bf16-hook": (None, pyring.hooks.bf16_compress_hook),
             "ddp-onebit-hook": (pyring.hooks.OneBitHookState(), pyring.hooks.onebit_hook)}
    for name, (state, hook) in hooks.items():
        net = _net(0).to(dev)
        ddp = DDP(net, device_ids=[0] if dev.type == "cuda" else None, bucket_cap_mb=0.001)
        if hook is not None:
            ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for x, y in data:
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        out[name] = _params(net)
    comm = pyring.init(rank, world, store, set_default=False)
    net = _net(1).to(dev)
    opt = pyring.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                                      net.named_parameters(), comm=comm, bucket_bytes=512)
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    out["distributed_optimizer"] = _params(net)
    net = _net(2).to(dev)
    ob = pyring.optim.OneBitAdam(net.parameters(), lr=1e-2, freeze_step=2, comm=comm)
    for x, y in data:
        ob.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        ob.step()
    out["onebit_adam"] = _params(net)
    # The kept residuals are bfloat16: compared by their bits.
    out["onebit_adam_residuals"] = [
        (v.view(torch.int16) if v.dtype == torch.bfloat16 else v).cpu().numpy()
        for v in ob.onebit.state_dict().values() if v is not None]
    net = _net(3).to(dev)
    pa = pyring.PeriodicAveraging(torch.optim.Adam(net.parameters(), lr=1e-2), period=2,
                                  warmup_steps=1, average_state=True, wire="bf16", comm=comm)
    for x, y in data:
        pa.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        pa.step()
    out["periodic_averaging"] = _params(net)
    links = comm.stats()["device_links"]
    out["how"] = {"device_transport": comm._c.device_transport,
                  "device_link_bytes": sum(v["bytes_sent"] for v in links.values())}
    comm.close()
    pyring.destroy()
    dist.destroy_process_group()
    return out
