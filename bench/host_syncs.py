"""Host-device synchronisations per round of the engine (issue 9, item 5: what a GPU would wait for).

On a GPU every call that brings a tensor's value to Python (``.item()``, ``.tolist()``, ``bool(t)``, ``int(t)``,
``float(t)``, ``.nonzero()`` and boolean-mask indexing, whose output size depends on the data) waits until the device
has finished all the work queued before it; on the CPU they cost nothing extra.  This counts them (a
``TorchFunctionMode``; the models on the CPU) per round of ``workers.segmented.advance_blocks`` for the one-component
gmm models of ``bench/many_models.py`` (5-value chunks, challengers on) at 1 and K models, over a stream's first
chunks and after a warm stretch.  A round's syncs do not grow with K where the code decides once per stack, and grow
with K where it loops over models.

    python bench/host_syncs.py [--models 1,128] [--chunks 20] [--warm 100]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from many_models import gmm_chunks, gmm_model  # noqa: E402

from workers.segmented import SegmentedEngine, advance_blocks  # noqa: E402

SYNCS = {
    torch.Tensor.item: "item",
    torch.Tensor.tolist: "tolist",
    torch.Tensor.__bool__: "bool",
    torch.Tensor.__int__: "int",
    torch.Tensor.__float__: "float",
    torch.Tensor.__index__: "index",
    torch.Tensor.nonzero: "nonzero",
    torch.nonzero: "nonzero",
    torch.Tensor.numpy: "numpy",
}


class Syncs(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.count: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = SYNCS.get(func)
        if name is None and func is torch.Tensor.__getitem__ and len(args) > 1:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
                name = "mask index"
        if name is not None:
            self.count[name] += 1
        return func(*args, **(kwargs or {}))


def rounds(k: int, chunks: int, warm: int) -> tuple[Counter[str], int]:
    engines = [SegmentedEngine.create(b["family"], b["params"], b["sampler"]) for b in map(gmm_model, range(k))]
    data = [torch.tensor(c["y"], dtype=torch.float64)[:, None] for c in gmm_chunks(warm + chunks)]
    for y in data[:warm]:
        advance_blocks(engines, [(None, y)] * k)
    with Syncs() as mode:
        for y in data[warm:]:
            advance_blocks(engines, [(None, y)] * k)
    return mode.count, chunks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="1,128")
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--warm", type=int, default=100)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("| models | chunks | syncs per round | per model-block | most frequent |")
    print("|---|---|---|---|---|")
    for k in map(int, args.models.split(",")):
        for warm in (0, args.warm):
            count, n = rounds(k, args.chunks, warm)
            total = sum(count.values())
            top = ", ".join(f"{name} {v / n:.0f}" for name, v in count.most_common(4))
            print(f"| {k} | {warm}-{warm + n} | {total / n:.0f} | {total / n / k:.1f} | {top} |", flush=True)


if __name__ == "__main__":
    main()
