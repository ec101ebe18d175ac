"""The engine's fixed and per-model costs by phase of a stream: one model alone against ``--models`` stacked (issue 9).

    python bench/stack_scaling.py [--models 128] [--chunks 128] [--phases 1,20,40,100] [--no-changepoints]
                                  [--changepoints JSON]

``bench/many_models.py``'s gmm workload without the service: one-component gmm models (its priors and seeds,
change-point challengers on) absorb the same 5-observation chunks through :func:`workers.segmented.advance_blocks`
(the worker's call for a stream's chunk), with the worker's thread count and garbage-collector settings.  First one
model alone, then ``--models`` models in one call per chunk.  For each phase of the stream (chunks ``[a, b)`` from
``--phases``' boundaries) it prints the CPU milliseconds per block of the lone model, per model-block of the stack,
and their ratio: the ceiling that the engine alone puts on ``bench/many_models.py``'s ratio (issue 9, acceptance 1
asks 30x end to end), and the stack's total CPU per chunk split as ``fixed + K x marginal`` with the lone model as
the fixed part (``marginal = (stack − lone) / (K − 1)``).

The last columns give the lone model's kernel time (:func:`workers.sgais.absorb_block`, timed by a wrapper around
it) and split the stack's time into the kernel and everything around it (the engine's per-population policies, the
change-point bookkeeping) per model-block, against the budget a ratio of 30x leaves: the lone model's ms per block
/ 30.

``--no-changepoints`` runs the models without their change-point challengers (``alerts.change_point.enabled`` false):
the main populations' share of the costs.  ``--changepoints JSON`` overrides change-point settings
(:class:`workers.changepoint.ChangepointSettings`, e.g. ``'{"max_challengers": 3}'``): what a challenger policy would
save, before any question of what it detects.

Two more columns need no clock: the populations (main and challengers) that absorb a block, per model-block, and the
challengers started per model-block, counted in the stacked run (the same for every model of it: same data, same
policy).  The column "kernel-only ratio" is the lone model's ms per block over the stacked kernel's ms per
model-block: the ratio if everything around the kernel cost nothing.

CPU time (``time.process_time``) of this process; a busy machine moves both columns, so compare within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def per_chunk(
    models: int, chunks: int, changepoints: bool = True, overrides: dict | None = None
) -> tuple[list[float], list[float], list[int], list[int]]:
    """CPU ms of each chunk's ``advance_blocks`` call for ``models`` models (the whole stack, not per model), of the
    kernel calls (:func:`workers.sgais.absorb_block`) within it, and the chunk's population-blocks (every model's
    main population and challengers that absorbed it, spawns included) and challenger starts, summed over models."""
    import torch

    import workers.segmented
    import workers.stacking
    from workers.changepoint import ChangepointSettings
    from workers.segmented import SegmentedEngine, advance_blocks

    kernel = [0.0]
    absorb = workers.stacking.sgais.absorb_block

    def timed(*a, **kw):
        t = time.process_time()
        try:
            return absorb(*a, **kw)
        finally:
            kernel[0] += time.process_time() - t

    workers.stacking.sgais.absorb_block = timed  # type: ignore[assignment]
    jobs = [0]
    stacked = workers.segmented._stacked

    def counted(todo, *a, **kw):  # the populations absorbing a (sub-)block: mains, live challengers, then spawns
        jobs[0] += len(todo)
        return stacked(todo, *a, **kw)

    workers.segmented._stacked = counted  # type: ignore[assignment]

    sys.path.insert(0, str(HERE))
    from many_models import gmm_chunks, gmm_model

    engines = []
    for i in range(models):
        body = gmm_model(i)
        cp = ChangepointSettings(**{**(overrides or {}), "enabled": changepoints})
        engines.append(SegmentedEngine.create(body["family"], body["params"], body["sampler"], cp))
    out, inner, populations, starts = [], [], [], []
    try:
        for c in gmm_chunks(chunks):
            y = torch.tensor(c["y"], dtype=torch.float64)
            kernel[0] = 0.0
            jobs[0] = 0
            before = sum(e.started for e in engines)
            t0 = time.process_time()
            res = advance_blocks(engines, [(None, y)] * models)
            out.append(1000 * (time.process_time() - t0))
            inner.append(1000 * kernel[0])
            populations.append(jobs[0])
            starts.append(sum(e.started for e in engines) - before)
            bad = [r for r in res if isinstance(r, Exception)]
            if bad:
                raise bad[0]
    finally:
        workers.stacking.sgais.absorb_block = absorb
        workers.segmented._stacked = stacked
    return out, inner, populations, starts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=128)
    ap.add_argument("--phases", default="1,20,40,100", help="chunk indices where a new phase starts (after 0)")
    ap.add_argument("--no-changepoints", action="store_true", help="the models without their challengers")
    ap.add_argument("--changepoints", default="{}", help="JSON overrides of the change-point settings")
    args = ap.parse_args()

    import torch

    from workers.runner import quiet_gc
    from workers.worker.loop import warm_lazy_imports

    torch.set_num_threads(1)  # as the worker (workers.config: torch_threads)
    warm_lazy_imports()
    quiet_gc()
    overrides = json.loads(args.changepoints)
    lone, lone_kernel, _, _ = per_chunk(1, args.chunks, not args.no_changepoints, overrides)
    stack, stack_kernel, populations, starts = per_chunk(args.models, args.chunks, not args.no_changepoints, overrides)
    K = args.models
    bounds = [0, *(int(v) for v in args.phases.split(",") if 0 < int(v) < args.chunks), args.chunks]
    cps = "without" if args.no_changepoints else f"with challengers {overrides or '(defaults)'}"
    print(f"one-component gmm, 5-value chunks, {K} models stacked against one alone, {cps} (CPU ms)")
    print(
        "| chunks | values | lone ms/block | stacked ms/model-block | ratio | marginal ms/model-block "
        "| lone kernel ms/block | stacked kernel ms/model-block | stacked rest ms/model-block "
        "| 30x budget ms/model-block | kernel-only ratio | populations per model-block | starts per model-block |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    spans = [(a, b, f"{a}-{b - 1}", f"{5 * a}-{5 * b - 1}") for a, b in zip(bounds[:-1], bounds[1:], strict=False)]
    for a, b, chunks, values in [*spans, (0, args.chunks, "all", f"0-{5 * args.chunks - 1}")]:
        one = statistics.fmean(lone[a:b])
        many = statistics.fmean(stack[a:b])
        kern = statistics.fmean(stack_kernel[a:b])
        print(
            f"| {chunks} | {values} | {one:.2f} | {many / K:.3f} | {one / (many / K):.1f}x | "
            f"{(many - one) / (K - 1):.3f} | {statistics.fmean(lone_kernel[a:b]):.2f} | {kern / K:.3f} | "
            f"{(many - kern) / K:.3f} | {one / 30:.3f} | {one / (kern / K):.1f}x | "
            f"{sum(populations[a:b]) / (K * (b - a)):.2f} | {sum(starts[a:b]) / (K * (b - a)):.3f} |"
        )


if __name__ == "__main__":
    main()
