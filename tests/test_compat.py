"""The T20 stack runs Python 3.8 and torch 1.10: mmgcu and tools must not need anything newer
(and the tests, some of which run there too, must parse on Python 3.8).

Only the torch_gcu 2.x accelerator (``mmgcu/device/gcu2.py``) and the simulator
(``mmgcu/sim/``) may use newer torch: they run on torch 2.x alone. The delegation gcu2.py
shares with CUDA (``mmgcu/device/device_module.py``) and the CUDA/CPU fallback
(``mmgcu/device/fallback.py``) must stay 1.10-only.
"""

import ast
import io
import os
import re
import tokenize

import pytest

from tests.conftest import REPO

ALLOWED_NEWER_TORCH = ("mmgcu/device/gcu2.py", "mmgcu/device/gcu2_amp.py", "mmgcu/sim/")

# torch APIs the torch 1.10 of the T20 stack lacks, each with the release that added it.
# Not listed, because torch 1.10 has them: torch.autocast(device_type) (added in 1.10),
# torch.cuda.amp, torch.inference_mode (1.9), torch.utils._pytree (1.8); nor the vendor's
# torch.distributed.is_eccl_available, which mmgcu probes with getattr.
NEWER_TORCH_APIS = {
    r"\btorch\.amp\.": "the torch.amp package: 1.12 (torch.amp.GradScaler: 2.3)",
    r"\btorch\.compile\b": "torch.compile: 2.0",
    r"\btorch\._dynamo\b": "TorchDynamo: 2.0",
    r"\btorch\.library\b": "Python operator registration (torch.library): 1.12",
    r"\brename_privateuse1_backend\b": "naming the PrivateUse1 device: 2.0/2.1",
    r"\b_register_device_module\b": "out-of-tree device modules (torch.xpu-style): after 1.10",
    r"\bregister_step_(pre|post)_hook\b": "optimizer step hooks: 2.0",
    r"\bset_default_device\b": "torch.set_default_device: 2.0",
    r"\btorch\.func\b": "torch.func (functorch merged): 2.0",
    r"\btorch\.export\b": "torch.export: 2.1",
    r"\bweights_only\b": "torch.load(weights_only=...): 1.13",
    r"\.untyped_storage\b": "Tensor.untyped_storage: 2.0",
    r"\btorch\.backends\.mps\b": "Apple MPS backend: 1.12",
    r"\bscaled_dot_product_attention\b": "F.scaled_dot_product_attention: 2.0",
    r"\b(all_gather_into_tensor|reduce_scatter_tensor)\b": "tensor collectives: 1.13",
    r"\bset_float32_matmul_precision\b": "torch.set_float32_matmul_precision: 1.12",
    r"\bdevice_mesh\b": "DeviceMesh: 2.2",
}


def sources(*tops):
    for top in tops:
        for root, _, files in os.walk(os.path.join(REPO, top)):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    yield os.path.relpath(path, REPO).replace(os.sep, "/"), path


def code_only(source):
    """``source`` with comments and string literals blanked, line numbers kept.

    A docstring may name a newer API, and ``getattr(torch, "compile", None)`` is how code
    probes for one safely; neither is a use.
    """
    lines = source.splitlines()
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    for tok in tokens:
        if tok.type not in (tokenize.COMMENT, tokenize.STRING):
            continue
        (srow, scol), (erow, ecol) = tok.start, tok.end
        for row in range(srow, erow + 1):
            line = lines[row - 1]
            start = scol if row == srow else 0
            end = ecol if row == erow else len(line)
            lines[row - 1] = line[:start] + " " * (end - start) + line[end:]
    return lines


def newer_torch_uses(source, where="<string>"):
    """``'where:line: code  (API: version)'`` for each use of a post-1.10 torch API."""
    found = []
    original = source.splitlines()
    for number, line in enumerate(code_only(source), start=1):
        for pattern, added in NEWER_TORCH_APIS.items():
            if re.search(pattern, line):
                found.append(f"{where}:{number}: {original[number - 1].strip()}  ({added})")
    return found


@pytest.mark.parametrize("rel,path", list(sources("mmgcu", "tools", "tests")), ids=lambda v: v)
def test_parses_as_python_38(rel, path):
    with open(path) as f:
        source = f.read()
    try:
        ast.parse(source, filename=rel, feature_version=(3, 8))
    except SyntaxError as e:
        pytest.fail(f"{rel}:{e.lineno}: not Python 3.8 syntax: {e.msg}")


def test_no_torch_api_newer_than_1_10():
    found = []
    for rel, path in sources("mmgcu", "tools"):
        if rel.startswith(ALLOWED_NEWER_TORCH):
            continue
        with open(path) as f:
            found += newer_torch_uses(f.read(), rel)
    print("\n".join(found))
    assert not found, "torch APIs newer than 1.10 outside gcu2.py and sim/:\n" + "\n".join(found)


def test_checker_catches_an_offender():
    source = (
        "import torch\n"
        "scaler = torch.amp.GradScaler('gcu')\n"
        "state = torch.load(path, weights_only=True)\n"
        "model = torch.compile(model)\n"
        "x.untyped_storage()\n"
    )
    found = newer_torch_uses(source, "bad.py")
    assert [f.split(":")[1] for f in found] == ["2", "3", "4", "5"], found
    assert found[0].startswith("bad.py:2: scaler = torch.amp.GradScaler('gcu')")


def test_checker_ignores_comments_strings_and_1_10_apis():
    source = (
        "import torch\n"
        "# torch.compile would be nice here\n"
        '"""Docs may mention torch.amp.GradScaler."""\n'
        "compile_ = getattr(torch, 'compile', None)\n"
        "ctx = torch.autocast('xla', dtype=torch.float16)\n"
        "scaler = torch.cuda.amp.GradScaler()\n"
        "ok = getattr(torch.distributed, 'is_eccl_available', None)\n"
    )
    assert newer_torch_uses(source) == []


def test_checker_sees_the_allowed_gcu2_accelerator():
    """The gcu2 accelerator really uses newer torch: proof that the scan reads real files."""
    with open(os.path.join(REPO, "mmgcu", "device", "gcu2.py")) as f:
        found = newer_torch_uses(f.read(), "mmgcu/device/gcu2.py")
    assert any("torch.amp.GradScaler" in f for f in found), found


@pytest.mark.parametrize("rel", ["mmgcu/device/device_module.py", "mmgcu/device/fallback.py"])
def test_the_shared_delegation_and_the_fallback_are_scanned_and_clean(rel):
    """device_module.py, which gcu2.py builds on, and fallback.py run on torch 1.10: they
    are not exempt."""
    assert not rel.startswith(ALLOWED_NEWER_TORCH)
    assert rel in dict(sources("mmgcu"))
    with open(os.path.join(REPO, rel)) as f:
        assert newer_torch_uses(f.read(), rel) == []
