"""Every random draw of the engine comes from a model's own generator (STYLE.md, determinism; DESIGN.md §9).

A draw from torch's global generator would make a model's bits depend on what else ran in the process (another
model, a stack of a different composition, a restart), and would not be checkpointed.  :class:`GlobalDraws` watches
every torch call (a ``TorchFunctionMode``) and records the random ones made without ``generator=``.  The engines of
every family run under it through change points, re-annealing replays, a checkpoint restored and a worker's round
trip through Redis; none may draw from the global generator.  Python's ``random`` and numpy's global generator are not
used in ``workers/``, ``models/`` or ``service/`` at all (a search of the sources, below).  The check found nothing
when written (session 33); it guards the code to come: a draw without ``generator=`` in the resampler fails it.
"""

from __future__ import annotations

import re
import traceback
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from tests.workers.test_device_agnostic import BLOCK, FAMILIES, SMALL, N, _stream
from workers.changepoint import ChangepointSettings
from workers.engine import ModelEngine
from workers.segmented import SegmentedEngine, advance_blocks

ROOT = Path(__file__).resolve().parents[2]
RANDOM = {
    torch.randn,
    torch.rand,
    torch.randint,
    torch.randperm,
    torch.normal,
    torch.multinomial,
    torch.bernoulli,
    torch.poisson,
    torch._standard_gamma,
    torch._sample_dirichlet,
    torch.randn_like,
    torch.rand_like,
    torch.randint_like,
    torch.Tensor.random_,
    torch.Tensor.uniform_,
    torch.Tensor.normal_,
    torch.Tensor.exponential_,
    torch.Tensor.geometric_,
    torch.Tensor.log_normal_,
    torch.Tensor.cauchy_,
    torch.Tensor.bernoulli_,
    torch.Tensor.bernoulli,
    torch.Tensor.multinomial,
}


class GlobalDraws(TorchFunctionMode):
    """Records (``found``: Counter of (function, innermost project frames)) every random torch call on this thread
    made without an explicit generator."""

    def __init__(self) -> None:
        super().__init__()
        self.found: Counter[tuple[str, str]] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in RANDOM and kwargs.get("generator") is None:
            frames = [f for f in reversed(traceback.extract_stack()[:-1]) if f.filename.startswith(str(ROOT))]
            where = " < ".join(f"{Path(f.filename).relative_to(ROOT)}:{f.lineno}" for f in frames[:3])
            self.found[(getattr(func, "__qualname__", str(func)), where)] += 1
        return func(*args, **kwargs)


def _report(found: Counter) -> str:
    return "\n".join(f"{n}x {fn} at {where}" for (fn, where), n in found.items())


def test_the_check_sees_a_draw_from_the_global_generator() -> None:
    g = torch.Generator().manual_seed(0)
    with GlobalDraws() as check:
        torch.randn(3, generator=g)
        torch.empty(3).uniform_(generator=g)
        assert not check.found
        torch.randn(3)
        torch.empty(3).normal_()
    assert sum(check.found.values()) == 2


def test_no_python_or_numpy_global_random_state_in_the_service() -> None:
    pattern = re.compile(r"\bimport random\b|\bnp\.random\.(?!default_rng|Generator)|\bnumpy\.random\.")
    hits = [
        f"{path.relative_to(ROOT)}:{i}"
        for package in ("workers", "models", "service")
        for path in (ROOT / package).rglob("*.py")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, hits


def test_engines_draw_only_from_their_own_generators(settings) -> None:
    """Change-point engines of every family in one round of stacks, through a change and a checkpoint restored;
    re-annealing replays (``reanneal_steps`` 1: every block after a change replays); a worker's round trip through
    Redis with a restore by a second worker."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from tests.integration.helpers import die, run_until_idle
    from workers.worker import Worker

    streams = [_stream(f, p) for f, p in FAMILIES]

    def chunk(j: int, a: int) -> tuple:
        x, y = streams[j]
        return (x[a : a + BLOCK] if x is not None else None), y[a : a + BLOCK]

    with GlobalDraws() as check:
        engines = [
            SegmentedEngine.create(f, p, {**SMALL, "seed": i}, ChangepointSettings())
            for i, (f, p) in enumerate(FAMILIES)
        ]
        for a in range(0, N, BLOCK):
            advance_blocks(engines, [e.family.validate(*chunk(j, a)) for j, e in enumerate(engines)])
        for j, e in enumerate(engines):
            SegmentedEngine.restore(
                e.to_bytes(include_history=False),
                e.changepoint_bytes(),
                ChangepointSettings(),
                lambda j=j: iter([chunk(j, s) for s in range(0, N, BLOCK)]),
            ).update(*chunk(j, 0))
        for i, (f, p) in enumerate(FAMILIES[:4]):
            replayed = ModelEngine(f, p, {**SMALL, "seed": i, "reanneal_steps": 1})
            x, y = streams[i]
            for a in range(0, N, 2 * BLOCK):
                replayed.update(x[a : a + 2 * BLOCK] if x is not None else None, y[a : a + 2 * BLOCK])
        with TestClient(create_app(settings, workers=0)) as api:
            body = {"family": "gmm", "params": {"dim": 1, "components": 2}, "sampler": SMALL}
            assert api.post("/v1/models", json={"name": "m", "stream": "s", **body}).status_code == 201
            y = streams[2][1]
            for a in range(0, N, BLOCK):
                assert api.post("/v1/streams/s/chunks", json={"y": y[a : a + BLOCK]}).status_code == 202
                if a == N // 2:
                    first = Worker(settings)
                    run_until_idle(first)
                    die(first)
            run_until_idle(Worker(settings))
            assert api.get("/v1/models/m/evidence").json()["observations"] == N
    assert not check.found, _report(check.found)
