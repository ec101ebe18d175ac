"""Device-agnostic engine without a GPU (issue 9, item 5): no tensor made on the CPU by default meets a tensor on the
model's device.

On a GPU such an operation raises ("Expected all tensors to be on the same device"); on the CPU both are the same
device and nothing shows, so the CUDA tests (``tests/workers/test_stack.py``) are the only other guard and CI has no
GPU.  :class:`ImplicitCpu` watches every torch call (a ``TorchFunctionMode``): a tensor made without a ``device``
(``torch.tensor(list)``, ``torch.arange(n)``, ``torch.from_numpy``, …) or moved by ``.cpu()`` is *implicitly on the
CPU*, and so is every result of an operation whose tensor inputs all are; an operation that mixes one of them (not a
0-d tensor, which torch moves; not an index into another tensor) with a tensor that is not is recorded with where
it happened.  Here every model's device is the CPU, so the runs below are the ordinary ones.

Found this way (session 33), each of which would raise on a GPU (not run on one here): the closed-form Laplace start's
grid of ``log σ²`` (``models.densities``: every AR and unknown-noise regression fit then fell back to L-BFGS), the
change locator's block likelihoods on the chunk's CPU values (``workers.segmented._block_likelihoods``: the
change-point models of every family), and the posterior summary's quantile probes
(``workers.engine``).
"""

from __future__ import annotations

import traceback
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from torch.overrides import TorchFunctionMode

from workers.changepoint import ChangepointSettings
from workers.segmented import SegmentedEngine, advance_blocks

ROOT = str(Path(__file__).resolve().parents[2]) + "/"
FACTORIES = {
    torch.tensor,
    torch.as_tensor,
    torch.zeros,
    torch.ones,
    torch.empty,
    torch.full,
    torch.arange,
    torch.linspace,
    torch.logspace,
    torch.eye,
    torch.randn,
    torch.rand,
    torch.randint,
    torch.randperm,
    torch.from_numpy,
    torch.scalar_tensor,
}
#: calls whose result is not a tensor that could meet another, or that move data between devices themselves
UNWATCHED = {
    torch.Tensor.tolist,
    torch.Tensor.item,
    torch.Tensor.__bool__,
    torch.Tensor.__len__,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__index__,
    torch.Tensor.__format__,
    torch.Tensor.__repr__,
    torch.Tensor.__iter__,
    torch.Tensor.dim,
    torch.Tensor.size,
    torch.Tensor.numel,
    torch.Tensor.data_ptr,
    torch.Tensor.copy_,
}


def _tensors(obj: Any, out: list[torch.Tensor]) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _tensors(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _tensors(o, out)
    return out


class ImplicitCpu(TorchFunctionMode):
    """Records (``found``: Counter of (operation, innermost project frames)) every torch call on this thread that
    mixes an implicitly-CPU tensor (module docstring) with another tensor."""

    def __init__(self) -> None:
        super().__init__()
        self._cpu: dict[int, weakref.ref] = {}
        self.found: Counter[tuple[str, str]] = Counter()

    def on_cpu(self, t: torch.Tensor) -> bool:
        ref = self._cpu.get(id(t))
        return ref is not None and ref() is t

    def _set(self, out: Any, cpu: bool) -> None:
        for t in _tensors(out, []):
            if cpu:
                self._cpu[id(t)] = weakref.ref(t)
            else:
                self._cpu.pop(id(t), None)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in UNWATCHED:
            return out
        if func in FACTORIES:
            from_tensor = func in (torch.tensor, torch.as_tensor) and args and isinstance(args[0], torch.Tensor)
            self._set(out, "device" not in kwargs and not (from_tensor and not self.on_cpu(args[0])))
            return out
        if func in (torch.Tensor.cpu, torch.Tensor.numpy):
            self._set(out, True)
            return out
        if func is torch.Tensor.to:
            target = kwargs.get("device") or next((a for a in args[1:] if isinstance(a, (torch.device, str))), None)
            like = next((a for a in args[1:] if isinstance(a, torch.Tensor)), None)
            if target is not None or like is not None:
                self._set(out, like is not None and self.on_cpu(like))
            else:  # a dtype only: where it was
                self._set(out, self.on_cpu(args[0]))
            return out
        ins = _tensors(args, []) + _tensors(kwargs, [])
        cpu = [t for t in ins if self.on_cpu(t)]
        other = [t for t in ins if not self.on_cpu(t)]
        mixing = [t for t in cpu if t.dim() > 0 and (func is not torch.Tensor.__getitem__ or t is args[0])]
        if mixing and other:
            frames = [f for f in reversed(traceback.extract_stack()[:-1]) if f.filename.startswith(ROOT)]
            where = " < ".join(f"{f.filename[len(ROOT) :]}:{f.lineno}" for f in frames[:4])
            self.found[(getattr(func, "__qualname__", str(func)), where)] += 1
        self._set(out, bool(ins) and not other)
        return out


def test_the_check_sees_a_cpu_tensor_meet_a_device_tensor() -> None:
    """The check can fail: a default-CPU tensor added to a model's tensor is recorded; an index, a 0-d tensor, a
    tensor made with ``device=`` or moved with ``.to(device=)`` are not."""
    model = torch.zeros(3, device="cpu")
    with ImplicitCpu() as check:
        _ = model + torch.arange(3)
        assert len(check.found) == 1
        _ = model[torch.tensor([0, 1, 2])] + torch.tensor(1.0) + torch.arange(3, device=model.device)
        _ = model + torch.tensor([1.0, 2.0, 3.0]).to(device=model.device) * 2
        _ = torch.stack([torch.ones(2), torch.ones(2)]).sum(0) * 2  # CPU with CPU
        assert len(check.found) == 1
        _ = model.cpu() * torch.ones(3, device=model.device)  # an explicit .cpu() meets the device again
    assert len(check.found) == 2


D64 = torch.float64
SMALL = {"particles": 6, "warmup_particles": 12, "warmup_observations": 60, "burn_in": 3, "batch_size": 40}
N, SHIFT, BLOCK = 100, 60, 10
FAMILIES = [
    ("autoregressive", {"order": 2}),
    ("autoregressive", {"order": 1, "noise_std": 1.0}),
    ("gmm", {"dim": 1, "components": 1}),
    ("gmm", {"dim": 2, "components": 2}),
    ("linear_regression", {"features": 3}),
    ("linear_regression", {"features": 3, "noise_std": None}),
    ("logistic_regression", {"features": 3, "classes": 3}),
    ("bnn", {"features": 3, "hidden": [4], "outputs": 1}),
]


def _stream(family: str, params: dict) -> tuple[list | None, list]:
    """JSON-like chunk values (as the worker decodes them) with a shift at SHIFT."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, 3, generator=g, dtype=D64)
    y = torch.randn(N, generator=g, dtype=D64) + 0.5 * x[:, 0]
    y[SHIFT:] += 4.0
    if family == "gmm":
        d = params["dim"]
        return None, (y[:, None] + torch.randn(N, d, generator=g, dtype=D64) * (d > 1)).tolist()
    if family == "autoregressive":  # AR(2)'s values far from its prior: a defensive (Laplace) start
        return None, (y * 10.0 + 30.0 if params["order"] == 2 else y).tolist()
    if family == "logistic_regression":
        return x.tolist(), ((x[:, 0] > 0).long() + (torch.arange(N) >= SHIFT).long()).tolist()
    return x.tolist(), y.tolist()


def test_every_family_keeps_its_tensors_on_the_models_device() -> None:
    """Change-point models of every family in one round of stacks, through a change, a checkpoint restored and fed
    on, and a posterior summary: no implicitly-CPU tensor meets the model's."""
    streams = [_stream(f, p) for f, p in FAMILIES]
    engines = [
        SegmentedEngine.create(f, p, {**SMALL, "seed": i}, ChangepointSettings()) for i, (f, p) in enumerate(FAMILIES)
    ]

    def chunk(j: int, a: int) -> tuple[Any, Any]:
        x, y = streams[j]
        return (x[a : a + BLOCK] if x is not None else None), y[a : a + BLOCK]

    alerts = []
    with ImplicitCpu() as check:
        for a in range(0, N, BLOCK):
            blocks = [e.family.validate(*chunk(j, a)) for j, e in enumerate(engines)]
            assert not [r for r in advance_blocks(engines, blocks) if isinstance(r, Exception)]
            alerts += [al for e in engines for al in e.take_alerts()]
            if a == SHIFT + BLOCK:  # every model from its checkpoint, as a worker restores it
                engines = [
                    SegmentedEngine.restore(
                        e.to_bytes(include_history=False),
                        e.changepoint_bytes(),
                        ChangepointSettings(),
                        lambda j=j, b=a + BLOCK: iter([chunk(j, s) for s in range(0, b, BLOCK)]),
                    )
                    for j, e in enumerate(engines)
                ]
        for e in engines:
            assert e.posterior_summary()["parameters"]
    assert any(al["kind"] == "change_point" for al in alerts)
    assert not check.found, "\n".join(f"{n}x {op} at {where}" for (op, where), n in check.found.items())


@pytest.mark.timeout(1800)  # the mode intercepts every torch call: 550 s on a slow 2-core machine beside a benchmark
def test_a_worker_keeps_its_tensors_on_the_models_device(settings) -> None:
    """The worker's path from Redis to the engine and back (chunks decoded, absorbed in stacks and committed; then a
    second worker restores every model from its checkpoint and absorbs the rest): no implicitly-CPU tensor meets the
    model's.  None of the three faults this module's docstring names shows here (the engine test above finds each);
    this one guards the worker's own code: decoding, stacking by layout, commits, restores."""
    from service.app import create_app
    from tests.integration.helpers import die, run_until_idle
    from workers.worker import Worker

    models = {f"m{i}": (f, p) for i, (f, p) in enumerate(FAMILIES) if f in ("autoregressive", "linear_regression")}
    ar, lr = _stream("autoregressive", {"order": 1}), _stream("linear_regression", {})

    def post(api: TestClient, a: int) -> None:
        assert api.post("/v1/streams/ar/chunks", json={"y": ar[1][a : a + BLOCK]}).status_code == 202
        body = {"x": lr[0][a : a + BLOCK], "y": lr[1][a : a + BLOCK]}
        assert api.post("/v1/streams/lr/chunks", json=body).status_code == 202

    with TestClient(create_app(settings, workers=0)) as api, ImplicitCpu() as check:
        for name, (f, p) in models.items():
            stream = "ar" if f == "autoregressive" else "lr"
            body = {"name": name, "stream": stream, "family": f, "params": p, "sampler": {**SMALL, "seed": 1}}
            assert api.post("/v1/models", json=body).status_code == 201
        for a in range(0, SHIFT, BLOCK):
            post(api, a)
        first = Worker(settings)
        run_until_idle(first)
        die(first)
        for a in range(SHIFT, N, BLOCK):
            post(api, a)
        run_until_idle(Worker(settings))
        done = {n: api.get(f"/v1/models/{n}/evidence").json() for n in models}
    assert all(e["observations"] == N and e["status"] != "error" for e in done.values()), done
    assert not check.found, "\n".join(f"{n}x {op} at {where}" for (op, where), n in check.found.items())
