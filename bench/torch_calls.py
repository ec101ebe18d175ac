"""Torch calls per model-block of the engine, by the function that makes them: where a small stack's time goes.

    python bench/torch_calls.py [--models 1] [--chunks 20] [--top 25]

On the engine's small tensors a torch call costs 1-3 µs whatever its arithmetic, so a lone model's time per block is
about its number of torch calls times that (session 26: 4,476 calls and 12-14 ms per block for a one-component gmm
from a stream's start).  This script runs the workload of ``bench/instruction_count.py`` (``--models``
one-component gmm models with change-point challengers, ``workers.segmented.advance_blocks`` from a stream's
start, 5-value chunks; one untimed warm-up run first) with a :class:`torch.overrides.TorchFunctionMode` that counts
every torch function and tensor method called, by the calling function (file, name and line), and prints the total
per model-block and the ``--top`` callers.  Deterministic: the same code base gives the same counts.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

import torch
from many_models import gmm_chunks, gmm_model
from torch.overrides import TorchFunctionMode

from workers.changepoint import ChangepointSettings
from workers.segmented import SegmentedEngine, advance_blocks


class CallCounter(TorchFunctionMode):
    """Counts torch calls by the Python frame that made them (``file:function:line``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None) -> Any:
        caller = sys._getframe(1)
        code = caller.f_code
        self.calls[f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}:{caller.f_lineno}"] += 1
        return func(*args, **(kwargs or {}))


def run(models: int, chunks: list[dict]) -> None:
    """``models`` fresh engines (``bench/many_models.py``'s priors and seeds) advanced together through ``chunks``."""
    engines = []
    for i in range(models):
        body = gmm_model(i)
        engines.append(SegmentedEngine.create(body["family"], body["params"], body["sampler"], ChangepointSettings()))
    for chunk in chunks:
        y = torch.tensor(chunk["y"], dtype=torch.float64)
        advance_blocks(engines, [(None, y)] * models)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=1)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    torch.set_num_threads(1)
    run(args.models, gmm_chunks(args.chunks, seed=1))  # first-use costs outside the count
    counter = CallCounter()
    with counter:
        run(args.models, gmm_chunks(args.chunks))
    blocks = args.models * args.chunks
    print(f"{sum(counter.calls.values()) / blocks:.1f} torch calls per model-block ({args.models} models)")
    for where, n in counter.calls.most_common(args.top):
        print(f"{n / blocks:9.1f}  {where}")


if __name__ == "__main__":
    main()
