"""Facts of torch_gcu 1.x that the simulator must model, each checked on the simulator.

Each fact names the file of the public 1.x source it comes from (repository
``mango-MilkT/GCU-PC-share``, folder ``torch_gcu/``). Run alone for the one-process facts
(``MMGCU_SIMULATE=2 MMGCU_SIMULATE_API=gcu1``), or under ``torchrun --nproc_per_node=2``
for the distributed ones; it prints one JSON line: ``{fact id: "" (holds), "skip: why",
or what failed}``.
"""

import io
import json
import os
import subprocess
import sys
import tempfile
import traceback

FACTS = []  # (id, 1.x source file, what it says, check, needs two ranks)


def fact(source, says, ranks=1):
    def register(check):
        FACTS.append((check.__name__, source, says, check, ranks))
        return check

    return register


def raises(exc, fn, *args, match="", **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        assert match in str(e), f"{type(e).__name__}: {e} (expected {match!r})"
        return e
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


# -- core/device.py -------------------------------------------------------------------
@fact("core/device.py", "cards are xla:N devices: gcu_device(i) is torch.device('xla', i)")
def cards_are_xla(tg, torch):
    assert tg.gcu_device(1) == torch.device("xla", 1)
    assert torch.ones(1, device=tg.gcu_device(1)).device == torch.device("xla", 1)


@fact("core/device.py", "set_device silently ignores an index that is not a card")
def set_device_ignores_invalid(tg, torch):
    tg.set_device(1)
    tg.set_device(7)
    assert tg.current_device() == 1


@fact("core/device.py", "a device of another type is refused")
def other_device_types_refused(tg, torch):
    raises(ValueError, tg.gcu_device, "cuda:0", match="Expected a gcu device")


# -- core/random.py, core/debug.py, core/version.py -----------------------------------
@fact("core/random.py", "manual_seed_all only (no manual_seed), for 32-bit seeds")
def seeding(tg, torch):
    assert not hasattr(tg, "manual_seed")
    tg.manual_seed_all(2**32 - 1)
    raises(ValueError, tg.manual_seed_all, 2**32, match="between 0~4294967295")


@fact("core/debug.py", "memory only as get_hbm_alloc_size (no CUDA-style statistics)")
def memory_statistics(tg, torch):
    for name in ("memory_allocated", "max_memory_allocated", "reset_peak_memory_stats"):
        assert not hasattr(tg, name), name
    assert not hasattr(tg, "empty_cache")
    before = tg.get_hbm_alloc_size(0)
    kept = torch.empty(1024, device="xla:0")
    assert tg.get_hbm_alloc_size(0) >= before + 4096
    del kept


@fact("core/version.py", "the version is get_version(); there is no __version__")
def version(tg, torch):
    assert isinstance(tg.get_version(), str)
    assert not hasattr(tg, "__version__")


@fact("core/pytorch_override.py", "torch_gcu adds Tensor.is_gcu()")
def is_gcu(tg, torch):
    assert torch.ones(1, device="xla:0").is_gcu() and not torch.ones(1).is_gcu()


# -- core/model.py -------------------------------------------------------------------
def _sgd(torch, card="xla:0"):
    model = torch.nn.Linear(3, 2).to(card)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.ones(4, 3, device=card)).sum()
    loss.backward()
    return model, opt, loss


@fact("core/model.py", "JitRunMode has SYNC, ASYNC and SAFEASYNC")
def jit_run_modes(tg, torch):
    assert {m.name for m in tg.JitRunMode} >= {"SYNC", "ASYNC", "SAFEASYNC"}


@fact("core/model.py", "optimizer_step takes no **kwargs (optimizer_args is a dict)")
def optimizer_step_signature(tg, torch):
    model, opt, loss = _sgd(torch)
    raises(TypeError, tg.optimizer_step, opt, [loss], model=model, closure=None)
    tg.optimizer_step(opt, [loss], optimizer_args={}, model=model, mode=tg.JitRunMode.ASYNC)


@fact("core/model.py", "optimizer_step checks its optimizer and model types")
def optimizer_step_types(tg, torch):
    model, opt, loss = _sgd(torch)
    raises(TypeError, tg.optimizer_step, "sgd")
    raises(TypeError, tg.optimizer_step, opt, [loss], model="model")


@fact("core/model.py", "unlazy takes a list of card tensors only")
def unlazy_card_tensors(tg, torch):
    raises(TypeError, tg.unlazy, [torch.ones(1)], match="GCU tensor")
    tg.unlazy([torch.ones(1, device="xla:0")])


@fact("core/model.py", "collect_amp_training_params needs torch_gcu's own GradScaler")
def amp_params_need_vendor_scaler(tg, torch):
    model, opt, loss = _sgd(torch)
    raises(TypeError, tg.collect_amp_training_params, model, opt, object())
    scaler = tg.amp.GradScaler(use_zero_grad=True)
    scaler.scale(loss)  # makes the scale tensors on the card
    outputs = tg.collect_amp_training_params(model, opt, scaler)
    assert all(t.device.type == "xla" for t in outputs)


@fact("core/model.py", "synchronize and sync_lived_tensor both exist")
def synchronisation(tg, torch):
    tg.synchronize(0)
    tg.sync_lived_tensor(0)


# -- amp/ ----------------------------------------------------------------------------
@fact("amp/autocast_mode.py", "autocast takes float16 and bfloat16, nothing else")
def autocast_dtypes(tg, torch):
    conv = torch.nn.Conv2d(3, 4, 3).to("xla:0")
    x = torch.randn(1, 3, 8, 8, device="xla:0")
    for dtype in (torch.float16, torch.bfloat16):
        with tg.amp.autocast(dtype=dtype):
            assert conv(x).dtype == dtype
    raises(RuntimeError, tg.amp.autocast, dtype=torch.float32, match="does not support")


@fact("amp/grad_scaler.py", "GradScaler is a plain object, not torch's GradScaler")
def scaler_is_plain(tg, torch):
    scaler = tg.amp.GradScaler()
    torch_scalers = [torch.cuda.amp.GradScaler]
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        torch_scalers.append(torch.amp.GradScaler)
    assert not isinstance(scaler, tuple(torch_scalers))


@fact("amp/grad_scaler.py", "use_zero_grad=True: an inf gradient steps with zeros, no host read")
def zero_grad_scaler(tg, torch):
    from mmgcu.sim import state

    model, opt, loss = _sgd(torch)
    model.weight.grad.fill_(float("inf"))
    before = model.weight.detach().cpu().clone()
    scaler = tg.amp.GradScaler(use_zero_grad=True)
    scaler.scale(loss)
    reads = state.host_reads()
    scaler.step(opt)
    scaler.update()
    assert state.host_reads() == reads, "the zero-grad step read a card value"
    assert torch.equal(model.weight.detach().cpu(), before)


@fact("amp/grad_scaler.py", "use_zero_grad=False: the step calls unlazy with an argument it lacks")
def skipping_scaler_fails(tg, torch):
    model, opt, loss = _sgd(torch)
    scaler = tg.amp.GradScaler(use_zero_grad=False)
    scaler.scale(loss)
    raises(TypeError, scaler.step, opt, match="device")


# -- checkpoints (torch 1.10's numpy pickling of xla tensors + core/pytorch_override.py) --
_TORCH2 = "skip: torch >= 2 pickles an xla tensor through a CPU tensor and applies map_location"


@fact("core/pytorch_override.py", "a saved card tensor comes back on the card only if current")
def checkpoint_card_tensor(tg, torch):
    if not torch.__version__.startswith("1."):
        return _TORCH2
    buf = io.BytesIO()
    torch.save({"t": torch.arange(3.0, device="xla:1")}, buf)
    tg.set_device(0)
    assert _load(torch, buf.getvalue())["t"].device.type == "cpu"
    tg.set_device(1)
    assert _load(torch, buf.getvalue())["t"].device == torch.device("xla", 1)
    data = buf.getvalue()
    assert b"xla:1" in data and b"numpy" in data, "not pickled through numpy"


def _load(torch, data):
    return torch.load(io.BytesIO(data))


@fact("core/pytorch_override.py", "without torch_gcu a checkpoint with a card tensor won't load")
def checkpoint_needs_torch_gcu(tg, torch):
    if not torch.__version__.startswith("1."):
        return _TORCH2
    path = os.path.join(tempfile.mkdtemp(), "card.pth")
    torch.save({"t": torch.arange(3.0, device="xla:0")}, path)
    code = f"import torch; torch.load({path!r}, map_location='cpu')"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMGCU_")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode != 0, "plain torch loaded a card tensor"


# -- nn/parallel/distributed.py (one process) ------------------------------------------
@fact("nn/parallel/distributed.py", "its DDP is an nn.Module, not torch's DDP", ranks=1)
def ddp_is_not_torch_ddp(tg, torch):
    import inspect

    ddp = tg.nn.parallel.DistributedDataParallel
    assert issubclass(ddp, torch.nn.Module)
    assert not issubclass(ddp, torch.nn.parallel.DistributedDataParallel)
    params = inspect.signature(ddp.__init__).parameters
    assert "static_graph" not in params and params["bucket_cap_mb"].default == 256


@fact("distributed/rendezvous.py", "off torchrun, its store server cannot share torch's port")
def own_store_server(tg, torch):
    import datetime
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    os.environ.update(env)
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    timeout = datetime.timedelta(seconds=20)
    dist.init_process_group("gloo", timeout=timeout)
    raises(Exception, tg.distributed.init_process_group, "eccl", timeout=timeout)
    # another free port (port + 1 may be taken by then: a gloo pair of a parallel test)
    url = f"tcp://127.0.0.1:{_free_port()}?rank=0&world_size=1"
    tg.distributed.init_process_group("eccl", init_method=url, timeout=timeout)
    assert tg.distributed.get_world_size() == 1


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@fact("distributed/rendezvous.py", "rendezvous() appends rank and world_size to a tcp:// URL")
def rendezvous_appends_node_arguments(tg, torch):
    import datetime

    url = f"tcp://127.0.0.1:{_free_port()}"
    store, rank, world_size = next(
        tg.distributed.rendezvous(url, 0, 1, timeout=datetime.timedelta(seconds=20))
    )
    assert (rank, world_size) == (0, 1)
    store.set("key", "value")
    assert store.get("key") == b"value"


@fact("distributed/rendezvous.py", "a URL that already names rank or world_size: AssertionError")
def rendezvous_refuses_node_arguments_twice(tg, torch):
    url = f"tcp://127.0.0.1:{_free_port()}?rank=0&world_size=1"
    raises(AssertionError, tg.distributed.rendezvous, url, 0, 1, match="node-specific arguments")
    raises(AssertionError, tg.distributed.rendezvous, url, world_size=1, match="already")


@fact(
    "distributed/rendezvous.py", "init_process_group('eccl', 'tcp://host:port', rank, world_size)"
)
def init_with_tcp_url_and_rank(tg, torch):
    # A fresh process: this one's torch_gcu.distributed is initialised by another fact.
    code = (
        "import mmgcu, torch_gcu.distributed as d\n"
        f"d.init_process_group('eccl', init_method='tcp://127.0.0.1:{_free_port()}', "
        "rank=0, world_size=1)\n"
        "print(d.get_rank(), d.get_world_size())\n"
    )
    env = dict(os.environ, LOCAL_RANK="0")
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-2:] == ["0", "1"], proc.stdout


# -- distributed/ (two ranks) -----------------------------------------------------------
@fact("distributed/distributed_c10d.py", "its groups are 'eccl' only", ranks=2)
def eccl_only(tg, torch):
    raises(RuntimeError, tg.distributed.new_group, backend="gloo", match="only support eccl")


@fact("distributed/distributed_c10d.py", "no object collectives", ranks=2)
def no_object_collectives(tg, torch):
    for name in ("broadcast_object_list", "all_gather_object", "gather_object"):
        assert not hasattr(tg.distributed, name), name


@fact("distributed/distributed_c10d.py", "a world of its own, apart from torch's", ranks=2)
def separate_worlds(tg, torch):
    import torch.distributed as dist

    assert dist.is_initialized() and tg.distributed.is_initialized()
    assert tg.distributed.group.WORLD is not dist.group.WORLD
    assert tg.distributed.get_backend() == "eccl" and dist.get_backend() == "gloo"


@fact("distributed/distributed_c10d.py", "torch.distributed has no 'eccl' backend", ranks=2)
def torch_has_no_eccl(tg, torch):
    import torch.distributed as dist

    assert "ECCL" not in getattr(dist.Backend, "_plugins", {})
    assert not hasattr(dist.Backend, "ECCL")


@fact("distributed/distributed_c10d.py", "ECCL sums card tensors, refuses CPU ones", ranks=2)
def eccl_card_tensors(tg, torch):
    rank = tg.distributed.get_rank()
    t = torch.full((2,), float(rank + 1), device=f"xla:{rank}")
    tg.distributed.all_reduce(t)
    assert t.cpu().tolist() == [3.0, 3.0]
    raises(RuntimeError, tg.distributed.all_reduce, torch.ones(2), match="only GCU tensors")


@fact("distributed/distributed_c10d.py", "its ReduceOp is its own type", ranks=2)
def own_reduce_op(tg, torch):
    import torch.distributed as dist

    t = torch.ones(1, device=f"xla:{tg.distributed.get_rank()}")
    raises(TypeError, tg.distributed.all_reduce, t, dist.ReduceOp.SUM)


#: The collectives of torch_gcu.distributed in the 1.x source, with their parameters.
COLLECTIVES = {
    "all_reduce": ["tensor", "op", "group", "async_op"],
    "broadcast": ["tensor", "src", "group", "async_op"],
    "reduce": ["tensor", "dst", "op", "group", "async_op"],
    "all_gather": ["tensor_list", "tensor", "group", "async_op"],
    "_all_gather_base": ["output_tensor", "input_tensor", "group", "async_op"],
    "reduce_scatter": ["output", "input_list", "op", "group", "async_op"],
    "_reduce_scatter_base": ["output", "input", "op", "group", "async_op"],
    "all_to_all": ["output_tensor_list", "input_tensor_list", "group", "async_op"],
    "all_to_all_single": [
        "output",
        "input",
        "output_split_sizes",
        "input_split_sizes",
        "group",
        "async_op",
    ],
    "barrier": ["group", "async_op", "device_ids"],
}


@fact("distributed/distributed_c10d.py", "its collectives, with the 1.x parameters")
def collectives_it_has(tg, torch):
    import inspect

    for name, parameters in COLLECTIVES.items():
        found = list(inspect.signature(getattr(tg.distributed, name)).parameters)
        assert found == parameters, (name, found)


@fact("distributed/distributed_c10d.py", "no gather, scatter, coalesced or monitored calls")
def collectives_it_lacks(tg, torch):
    lacks = ("gather", "scatter", "all_reduce_coalesced", "all_gather_coalesced")
    for name in lacks + ("monitored_barrier", "all_gather_into_tensor", "reduce_scatter_tensor"):
        assert not hasattr(tg.distributed, name), name


@fact("distributed/distributed_c10d.py", "ReduceOp: SUM PRODUCT MIN MAX BAND BOR BXOR, no AVG")
def reduce_op_members(tg, torch):
    names = [op.name for op in tg.distributed.ReduceOp]
    assert names == ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"], names


def _card_values(tg, torch, *values):
    return torch.tensor(values, dtype=torch.float32).to(f"xla:{tg.distributed.get_rank()}")


@fact("distributed/distributed_c10d.py", "reduce, and the reduce-scatters, on cards", ranks=2)
def eccl_reduce_and_reduce_scatter(tg, torch):
    d, rank = tg.distributed, tg.distributed.get_rank()
    t = _card_values(tg, torch, rank + 1.0, 10.0)
    d.reduce(t, dst=1, op=d.ReduceOp.MAX)
    if rank == 1:
        assert t.cpu().tolist() == [2.0, 10.0]
    out = _card_values(tg, torch, 0.0)
    parts = [_card_values(tg, torch, (rank + 1) * (i + 1.0)) for i in range(2)]
    d.reduce_scatter(out, parts)  # rank i: the sum of every rank's i-th part
    assert out.cpu().tolist() == [3.0 * (rank + 1)]
    out = _card_values(tg, torch, 0.0, 0.0)
    work = d._reduce_scatter_base(out, _card_values(tg, torch, 1.0, 2.0, rank, 4.0), async_op=True)
    work.wait()
    assert out.cpu().tolist() == ([2.0, 4.0] if rank == 0 else [1.0, 8.0])


@fact("distributed/distributed_c10d.py", "the all-gathers and all-to-alls, on cards", ranks=2)
def eccl_gathers_and_all_to_all(tg, torch):
    d, rank = tg.distributed, tg.distributed.get_rank()
    out = _card_values(tg, torch, 0.0, 0.0, 0.0, 0.0)
    d._all_gather_base(out, _card_values(tg, torch, rank, rank + 0.5))
    assert out.cpu().tolist() == [0.0, 0.5, 1.0, 1.5]
    # rank r sends [r, r] to rank 0 and [10 + r] to rank 1
    splits = [2, 2] if rank == 0 else [1, 1]
    out = _card_values(tg, torch, *[0.0] * sum(splits))
    d.all_to_all_single(out, _card_values(tg, torch, rank, rank, 10.0 + rank), splits, [2, 1])
    assert out.cpu().tolist() == ([0.0, 0.0, 1.0, 1.0] if rank == 0 else [10.0, 11.0])
    outs = [_card_values(tg, torch, 0.0) for _ in range(2)]
    d.all_to_all(outs, [_card_values(tg, torch, 10.0 * rank + i) for i in range(2)])
    assert [o.cpu().item() for o in outs] == [float(rank), 10.0 + rank]


@fact("nn/parallel/distributed.py", "device_ids=None means every visible card", ranks=2)
def ddp_device_ids_none(tg, torch):
    model = torch.nn.Linear(3, 2).to(f"xla:{tg.distributed.get_rank()}")
    raises(NotImplementedError, tg.nn.parallel.DistributedDataParallel, model, match="every")
    raises(
        RuntimeError,
        tg.nn.parallel.DistributedDataParallel,
        model,
        device_ids=[0, 1],
        match="single element",
    )


@fact("nn/parallel/distributed.py", "gradient_as_bucket_view=True is refused on a card", ranks=2)
def ddp_no_bucket_view(tg, torch):
    rank = tg.distributed.get_rank()
    model = torch.nn.Linear(3, 2).to(f"xla:{rank}")
    raises(
        RuntimeError,
        tg.nn.parallel.DistributedDataParallel,
        model,
        device_ids=[rank],
        gradient_as_bucket_view=True,
    )


@fact("nn/parallel/distributed.py", "CPU module with device_ids: the field error", ranks=2)
def ddp_cpu_module_with_device_ids(tg, torch):
    raises(
        AssertionError,
        tg.nn.parallel.DistributedDataParallel,
        torch.nn.Linear(3, 2),
        device_ids=[tg.distributed.get_rank()],
        match="device_ids and output_device arguments only work",
    )


@fact("nn/parallel/distributed.py", "gradients are averaged over the ECCL group", ranks=2)
def ddp_averages_gradients(tg, torch):
    rank = tg.distributed.get_rank()
    torch.manual_seed(rank)  # different weights: DDP broadcasts rank 0's
    model = torch.nn.Linear(3, 1).to(f"xla:{rank}")
    ddp = tg.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    ddp(torch.full((2, 3), float(rank + 1))).sum().backward()
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    others = flat.clone()
    tg.distributed.all_reduce(others)  # both ranks hold the same average: the sum is twice it
    assert torch.allclose((others / 2).cpu(), flat.cpu())
    # weight grad = mean over ranks of 2 * (rank + 1) per input element = 3
    assert torch.allclose(model.weight.grad.cpu(), torch.full((1, 3), 3.0))


def _setup_distributed(tg):
    import datetime

    import torch.distributed as dist

    from mmgcu.device.gcu1 import eccl_init_method

    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group("gloo", timeout=timeout)
    tg.set_device(int(os.environ["LOCAL_RANK"]))
    url = eccl_init_method(dist)  # off torchrun's agent store, MASTER_PORT is torch's
    tg.distributed.init_process_group("eccl", url, timeout=timeout, group_name="facts_eccl")


def main() -> None:
    import importlib

    import torch

    import mmgcu  # noqa: F401  (installs the simulated torch_gcu)

    tg = importlib.import_module("torch_gcu")

    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    if ranks > 1:
        _setup_distributed(tg)
    results = {}
    for name, _, _, check, needs in FACTS:
        if needs != ranks:
            continue
        try:
            results[name] = check(tg, torch) or ""
        except Exception:
            results[name] = traceback.format_exc(limit=3)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
