"""A round's stream entries are decoded once and validated once per layout, the tensors shared by every model
reading them (:class:`workers.worker.blocks.RoundChunks`): safe only if no engine or family writes its input
in place.  Checked here on the worker's own path (the shared tensors, the stacked ``advance_blocks`` block by
block, change-point challengers on) over a stream's first 100 values, where the blocks are single values, then
of ``block_size``, and the challengers start."""

from __future__ import annotations

import torch

from workers.engine import block_bounds
from workers.segmented import SegmentedEngine, advance_blocks
from workers.store import records
from workers.worker.blocks import RoundChunks, layout
from workers.worker.restore import changepoint_settings

D64 = torch.float64
SAMPLER = {"particles": 8, "warmup_particles": 16, "warmup_observations": 40, "burn_in": 3}
# (family, params, stream): gmm and autoregressive read one stream in two layouts, [B, 1] and [B]; the
# regressions read x: [B, 2] whole or its column 0
MODELS = [
    ("gmm", {"dim": 1, "components": 1}, "y"),
    ("gmm", {"dim": 1, "components": 1, "variance_shape": 2.0}, "y"),
    ("autoregressive", {"order": 1}, "y"),
    ("linear_regression", {"features": 2}, "xy"),
    ("linear_regression", {"features": [0], "columns": 2}, "xy"),
]


def _entries(n_chunks: int) -> dict[str, list[dict[bytes, bytes]]]:
    """Stream-log entries (raw XRANGE fields) of 5-value chunks on the two streams."""
    g = torch.Generator().manual_seed(0)
    out: dict[str, list[dict[bytes, bytes]]] = {"y": [], "xy": []}
    for _ in range(n_chunks):
        y = 0.3 + torch.randn(5, generator=g, dtype=D64)
        x = torch.randn(5, 2, generator=g, dtype=D64)
        for stream, (xs, ys) in (("y", (None, y)), ("xy", (x, x @ torch.tensor([0.7, -0.4], dtype=D64) + y))):
            fields = records.encode_chunk(xs, ys)
            out[stream].append({k.encode(): v.encode() if isinstance(v, str) else v for k, v in fields.items()})
    return out


def _engines() -> list[SegmentedEngine]:
    return [
        SegmentedEngine.create(family, params, {**SAMPLER, "seed": i}, changepoint_settings({}))
        for i, (family, params, _) in enumerate(MODELS)
    ]


def _absorb(engines: list[SegmentedEngine], chunks: list[tuple]) -> list:
    """One chunk per engine (``(x, y)``), block by block, stacked as ``Worker.absorb_round`` does."""
    out = []
    bounds = [
        block_bounds(e.observations, int(y.shape[0]), e.settings.block_size)
        for e, (_, y) in zip(engines, chunks, strict=True)
    ]
    for j in range(max(len(b) for b in bounds)):
        group = [k for k in range(len(engines)) if j < len(bounds[k])]
        blocks = []
        for k in group:
            (a, b), (x, y) = bounds[k][j], chunks[k]
            blocks.append((x[a:b] if x is not None else None, y[a:b]))
        out += advance_blocks([engines[k] for k in group], blocks)
    return out


def test_shared_chunks_are_not_written_and_give_the_same_bits() -> None:
    entries = _entries(20)
    shared, alone = _engines(), _engines()
    assert len({layout(e.family) for e in shared}) == 4  # the two gmm models share a layout
    for i in range(20):
        chunks = RoundChunks()
        views = [
            chunks.get(stream, str(i).encode(), entries[stream][i], e.family, layout(e.family))
            for e, (*_, stream) in zip(shared, MODELS, strict=True)
        ]
        assert views[0] is views[1]  # one validated chunk for both gmm models
        assert views[0][1].untyped_storage().data_ptr() == views[2][1].untyped_storage().data_ptr()  # one decode
        pristine = [(None if x is None else x.clone(), y.clone(), None if x is None else x._version, y._version)
                    for x, y in views]  # fmt: skip
        got = _absorb(shared, views)
        for (x, y), (x0, y0, xv, yv) in zip(views, pristine, strict=True):
            assert torch.equal(y, y0) and y._version == yv
            assert x is None or (torch.equal(x, x0) and x._version == xv)
        # the same models from their own decoded and validated copies, as before the sharing: the same bits
        own = [
            e.family.validate(*records.decode_chunk(entries[stream][i]))
            for e, (*_, stream) in zip(alone, MODELS, strict=True)
        ]
        assert [repr(r) for r in got] == [repr(r) for r in _absorb(alone, own)]
    assert all(e.challengers for e in shared)  # the challengers read the shared tensors too
    assert [e.to_bytes(include_history=False) for e in shared] == [e.to_bytes(include_history=False) for e in alone]
