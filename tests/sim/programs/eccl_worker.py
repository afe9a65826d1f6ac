"""One rank of two: collectives on card and CPU tensors, then DDP in sync.

Run as rank RANK of WORLD_SIZE (LOCAL_RANK, MASTER_ADDR, MASTER_PORT set) with
MMGCU_SIMULATE=2 and MMGCU_SIMULATE_API. On torch_gcu 2.x one torch.distributed group
carries both (``cpu:gloo,gcu:eccl``); on 1.x CPU tensors go over a torch.distributed gloo
group and card tensors over torch_gcu.distributed's own ECCL world. DDP starts from a
rank-dependent model on rank-dependent data; it is compared with one CPU model trained on
both ranks' data. Prints what it found as one JSON line.
"""

import json
import os

import sim_alone  # noqa: F401

import mmgcu.sim
from mmgcu.sim import install

torch_gcu = install()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

api = mmgcu.sim.state.api
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
out = {}
if api == "gcu2":
    dist.init_process_group("cpu:gloo,gcu:eccl")
    torch.gcu.set_device(rank)
    card = torch.device("gcu", rank)
    card_dist, group = dist, None
else:
    dist.init_process_group("gloo")
    torch_gcu.set_device(rank)
    card_dist = torch_gcu.distributed
    port = int(os.environ["MASTER_PORT"]) + 1  # torch.distributed's store holds MASTER_PORT
    card_dist.init_process_group(
        "eccl",
        init_method=f"tcp://127.0.0.1:{port}?rank={rank}&world_size={world}",
        group_name="test_eccl",
    )
    card = torch_gcu.gcu_device(rank)
    group = card_dist.group.WORLD
    out["eccl_world"] = card_dist.get_world_size() == world
out["backend"] = card_dist.get_backend(group)

t = torch.full((4,), float(rank + 1)).to(card)
card_dist.all_reduce(t, card_dist.ReduceOp.SUM, group=group)
out["card_sum"] = [str(t.device), [t[i].item() for i in range(4)]]
base = torch.zeros(8).to(card)
view = base[2:6]
view.fill_(float(rank + 1))
card_dist.all_reduce(view, card_dist.ReduceOp.SUM, group=group)  # in place, under the view
out["view_sum"] = [base[i].item() for i in range(8)]
# Past the size the simulator sums through rank 0, and ops other than a sum: the same
# in-place results as ECCL's all-reduce; a small integer sum keeps its dtype.
big = torch.full((1 << 20,), float(rank + 1)).to(card)
card_dist.all_reduce(big, card_dist.ReduceOp.SUM, group=group)
out["big_sum"] = [big.min().item(), big.max().item()]
top = torch.tensor([float(rank), 5.0 - rank]).to(card)
card_dist.all_reduce(top, card_dist.ReduceOp.MAX, group=group)
out["max"] = [top[0].item(), top[1].item()]
ints = torch.full((3,), rank + 1, dtype=torch.int32).to(card)
card_dist.all_reduce(ints, card_dist.ReduceOp.SUM, group=group)
out["int_sum"] = [str(ints.dtype), [ints[i].item() for i in range(3)]]
halves = torch.full((3,), 0.5 * (rank + 1), dtype=torch.float16).to(card)
card_dist.all_reduce(halves, card_dist.ReduceOp.SUM, group=group)
out["half_sum"] = [str(halves.dtype), [halves[i].item() for i in range(3)]]
cpu = torch.full((4,), float(rank + 1))
dist.all_reduce(cpu)  # 2.x: the group's CPU route; 1.x: the gloo group
out["cpu_sum"] = [str(cpu.device), cpu.sum().item()]
if api == "gcu1":
    try:
        card_dist.all_reduce(torch.ones(2), card_dist.ReduceOp.SUM, group=group)
        out["cpu_on_eccl"] = None
    except RuntimeError as e:
        out["cpu_on_eccl"] = str(e)


def make(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def batches(r):
    g = torch.Generator().manual_seed(100 + r)
    return [torch.randn(6, 4, generator=g) for _ in range(2)]


model = make(seed=rank).to(card)  # DDP must broadcast rank 0's start
out["start"] = sum(p.detach().double().sum().item() for p in model.parameters())
if api == "gcu2":
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
else:
    try:  # device_ids=None: every visible card in this one process
        torch_gcu.nn.parallel.DistributedDataParallel(model)
        out["every_card"] = None
    except NotImplementedError as e:
        out["every_card"] = str(e)
    ddp = torch_gcu.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
for x in batches(rank):
    opt.zero_grad()
    loss = ddp(x.to(card)).pow(2).mean()
    loss.backward()
    if api == "gcu2":
        opt.step()
    else:
        torch_gcu.optimizer_step(opt, [loss.detach()], model=ddp)

# The same two steps on the CPU over both ranks' batches: DDP averages the gradients.
ref = make(seed=0)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
for xs in zip(*(batches(r) for r in range(world))):
    ref_opt.zero_grad()
    ref(torch.cat(xs)).pow(2).mean().backward()
    ref_opt.step()

out["checksum"] = [p.detach().double().sum().item() for p in model.parameters()]
out["ref_diff"] = max(
    (p.detach() - r.detach().to(card)).abs().max().item()
    for p, r in zip(model.parameters(), ref.parameters())
)
out["devices"] = sorted(
    {str(p.device) for p in model.parameters()} | {str(p.grad.device) for p in model.parameters()}
)
print(json.dumps(out))
if api == "gcu1":
    card_dist.destroy_process_group()
dist.destroy_process_group()
