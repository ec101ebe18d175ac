"""The worker's engine on ``bench/many_models.py``'s gmm workload, without the service: ``--models`` one-component
gmm models (many_models' priors and seeds, change-point challengers on) absorb the same ``--chunks``
5-observation chunks through :func:`workers.segmented.advance_blocks`, the call the worker makes for a stream's
chunk, with the worker's garbage-collector settings (:func:`workers.runner.quiet_gc`).  Prints CPU milliseconds
per model-block (``time.process_time``: less sensitive to other tenants than wall time, still not immune), SGHMC
model-steps computed against those the models needed (a stack runs its longest model's steps; models that
finished early are masked), and defensive Laplace fits (``workers.conflict.best_laplace`` calls, each one
population's first block) with how many of them ran L-BFGS (``workers.conflict.laplace`` calls: the families without a
closed-form mode, four starts each where the family is not unimodal), and the ESS increment's calls
(``workers.sgais.solve_increment``) with their conditional-ESS evaluations (``workers.ess._cess``).  A checkout whose
script lacks a count prints ``?``; ``PYTHONPATH=DIR python bench/engine_stack.py --json-only --models 1`` counts
another checkout's code with this script.

``--baseline DIR`` runs the same workload from another checkout (e.g. ``git worktree add /tmp/base <commit>``)
in a subprocess, alternating with this one ``--repeats`` times, and prints the ratio per repeat.

    python bench/engine_stack.py [--models 128] [--chunks 20] [--baseline DIR] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(models: int, chunks: int) -> dict:
    """CPU ms per model-block and the deterministic counts, for the checkout on ``sys.path``."""
    import torch

    from workers import conflict, sgais
    from workers.segmented import SegmentedEngine, advance_blocks
    from workers.worker.loop import warm_lazy_imports

    sys.path.insert(0, str(HERE))
    from many_models import gmm_chunks, gmm_model

    torch.set_num_threads(1)  # as the worker (workers.config: torch_threads)
    warm_lazy_imports()
    try:  # the worker's garbage-collector settings (workers.runner.quiet_gc), where the checkout has them
        from workers.runner import quiet_gc
    except ImportError:
        pass
    else:
        quiet_gc()
    from workers import ess

    counts = {"computed": 0, "needed": 0, "laplace": 0, "lbfgs": 0, "increments": 0, "cess": 0}
    steps, fit, best = sgais._sghmc_steps, conflict.laplace, conflict.best_laplace
    solve, cess = sgais.solve_increment, ess._cess

    def counted_steps(*args):  # the per-model step counts come last (whatever the code base's other arguments)
        c = args[-1]
        counts["computed"] += max(c, default=0) * len(c)
        counts["needed"] += sum(c)
        return steps(*args)

    def counted_fit(*a, **k):
        counts["lbfgs"] += 1
        return fit(*a, **k)

    def counted_best(*a, **k):
        counts["laplace"] += 1
        return best(*a, **k)

    def counted_solve(*a, **k):  # the ESS increment's calls (workers.ess.solve_increment) ...
        counts["increments"] += 1
        return solve(*a, **k)

    def counted_cess(*a):  # ... and its conditional-ESS evaluations
        counts["cess"] += 1
        return cess(*a)

    sgais._sghmc_steps, conflict.laplace, conflict.best_laplace = counted_steps, counted_fit, counted_best
    sgais.solve_increment, ess._cess = counted_solve, counted_cess
    engines = []
    for i in range(models):
        body = gmm_model(i)
        engines.append(SegmentedEngine.create(body["family"], body["params"], body["sampler"]))
    data = [torch.tensor(c["y"], dtype=torch.float64) for c in gmm_chunks(chunks)]
    t0, w0 = time.process_time(), time.perf_counter()
    for y in data:
        out = advance_blocks(engines, [(None, y)] * models)
        bad = [o for o in out if isinstance(o, Exception)]
        if bad:
            raise bad[0]
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    return {"cpu_ms": 1000 * cpu / (models * chunks), "wall_ms": 1000 * wall / (models * chunks), **counts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--baseline", help="another checkout to compare with, run alternately in a subprocess")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.json_only:
        print(json.dumps(run(a.models, a.chunks)))
        return

    def child(root: Path) -> dict:
        cmd = [sys.executable, str(root / "bench" / "engine_stack.py"), "--json-only"]
        cmd += ["--models", str(a.models), "--chunks", str(a.chunks)]
        env = {**os.environ, "PYTHONPATH": str(root)}  # that checkout's packages, not the installed ones
        out = subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    roots = [HERE.parent] + ([Path(a.baseline).resolve()] if a.baseline else [])
    ratios = []
    for r in range(a.repeats if a.baseline else 1):
        res = [child(root) for root in roots]
        for root, x in zip(roots, res, strict=True):
            print(
                f"repeat {r} {root}: {x['cpu_ms']:.3f} CPU ms per model-block (wall {x['wall_ms']:.3f}); SGHMC "
                f"model-steps computed {x['computed']:,} for {x['needed']:,} needed; Laplace fits {x['laplace']} "
                f"(L-BFGS runs {x.get('lbfgs', '?')}); ESS increments {x.get('increments', '?')} with "
                f"{x.get('cess', '?')} conditional-ESS evaluations"
            )
        if a.baseline:
            ratios.append(res[1]["cpu_ms"] / res[0]["cpu_ms"])
            print(f"repeat {r}: baseline / this = {ratios[-1]:.2f}x")
    if ratios:
        print(f"median speed-up {statistics.median(ratios):.2f}x over {len(ratios)} repeats")


if __name__ == "__main__":
    main()
