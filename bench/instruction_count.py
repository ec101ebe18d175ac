"""Instructions per model-block of the engine, counted by valgrind: a cost measure the machine's load cannot move.

    python bench/instruction_count.py [--roots /tmp/base,.] [--models 1] [--chunks 20] [--reps 2]

Times on the 2-core machines these benchmarks run on drift by 1.5-2x within minutes (other tenants), so a change of
5-10% in the engine's cost is lost in the noise of alternating timed runs (session 26: the same lone-model benchmark
gave 12 and 18 ms per block a minute apart). Counting the instructions the process executes is repeatable to about
0.2% for a given code base and input (probably Python's hash seeds): this script runs the workload of
``bench/many_models.py --part gmm`` without the service (``--models`` one-component gmm models with change-point
challengers, advanced together by ``workers.segmented.advance_blocks`` from a stream's start, 5-value chunks) under
``valgrind --tool=callgrind`` for each code base in ``--roots`` (each on ``PYTHONPATH``; the workload is
``bench/torch_calls.py``'s ``run``), twice: once with only the imports and an untimed warm-up run, once with
``--reps`` runs more; the difference, over ``reps · models · chunks``, is the instructions per model-block. The
roots run in parallel (one process each). Instructions are not time (a cache miss costs more than an add), but the
engine's cost on small tensors is dominated by the number of tensor calls and Python byte codes, which they count.
Needs valgrind (``apt-get install valgrind``); about two minutes per root for one model and two reps.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

WORKLOAD = """
import sys
import torch
from many_models import gmm_chunks
from torch_calls import run  # the workload of bench/torch_calls.py, found in this script's folder for older roots

torch.set_num_threads(1)
models, chunks, reps = (int(v) for v in sys.argv[1:4])
run(models, gmm_chunks(chunks, seed=1))  # first-use costs (lazy imports, caches) outside the count
for _ in range(reps):
    run(models, gmm_chunks(chunks))
"""


def instructions(root: Path, models: int, chunks: int, reps: int, script: Path) -> int:
    """Instructions (callgrind's ``I refs``) of the workload with ``reps`` counted runs under ``root``'s code."""
    path = os.pathsep.join([str(root), str(root / "bench"), str(Path(__file__).resolve().parent)])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/cg.out",
                sys.executable,
                str(script),
                str(models),
                str(chunks),
                str(reps),
            ],  # fmt: skip
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--roots", default=".", help="code bases to compare, comma-separated (each a checkout's root)")
    ap.add_argument("--models", type=int, default=1)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    roots = [Path(r).resolve() for r in args.roots.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "workload.py"
        script.write_text(WORKLOAD)
        jobs = [(root, reps) for root in roots for reps in (0, args.reps)]
        with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
            counts = list(pool.map(lambda job: instructions(job[0], args.models, args.chunks, job[1], script), jobs))
    blocks = args.reps * args.models * args.chunks
    per_block = {}
    for i, root in enumerate(roots):
        per_block[root] = (counts[2 * i + 1] - counts[2 * i]) / blocks
    first = per_block[roots[0]]
    print(f"{args.models} models, {args.chunks} chunks from a stream's start, {args.reps} counted runs:")
    for root, n in per_block.items():
        print(f"  {root}: {n / 1e6:.2f} M instructions per model-block ({n / first:.3f} of the first)")


if __name__ == "__main__":
    main()
