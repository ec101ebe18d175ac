"""A chunk -> processed blocks -> trace rows: the one path from the engine's block diagnostics to the
rows the worker commits (and the tests' reference traces are computed with)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workers.engine import ModelEngine, block_bounds
from workers.quarantine import Budget
from workers.segmented import SegmentedEngine
from workers.state import BlockInfo
from workers.store import records


@dataclass(frozen=True)
class Block:
    """One processed block: the engine's diagnostics and the trace row (``records.trace_row``)."""

    info: BlockInfo
    row: dict[str, Any]


def absorb_chunk(
    engine: ModelEngine | SegmentedEngine,
    x: Any,
    y: Any,
    *,
    seq: int,
    first_index: int,
    clock: Callable[[], float] = time.perf_counter,
    budget: Budget | None = None,
) -> list[Block]:
    """Absorb a chunk (``x: [B, d] | None``, ``y: [B, ...]``, validated by the family as they come from
    the stream log) block by block, each of ``engine.settings.block_size`` values, timing each update.

    ``seq`` is the chunk's number, ``first_index`` the stream index of its first value.  ``budget`` (the
    block budget, :class:`workers.quarantine.Budget`) is armed for each block's update only.

    Raises
    ------
    workers.sgais.NumericalError, ValueError
        From the engine; the blocks before the failing one stay absorbed.
    """
    # The stream log holds the chunk as validated by the stream's schema; this model's family may lay
    # it out differently (a 1-D gmm wants y: [B, 1], an autoregressive model y: [B]).
    x, y = engine.family.validate(x, y)
    out = []
    # blocks of block_size, except the stream's first values, one each (rows at each small count for the
    # aligned comparison: workers.engine.block_bounds)
    for start, stop in block_bounds(engine.observations, int(y.shape[0]), engine.settings.block_size):
        xb, yb = (x[start:stop] if x is not None else None), y[start:stop]
        t0 = clock()
        if budget is not None:
            budget.start()
        try:
            (info,) = engine.update(xb, yb, validated=True)
        finally:
            if budget is not None:
                budget.stop()
        seconds = clock() - t0
        row = records.trace_row(
            info, seq=seq, first_index=first_index + start, block_observations=int(yb.shape[0]), seconds=seconds
        )
        row.update(change_fields(engine))
        out.append(Block(info, row))
    return out


def change_fields(engine: Any) -> dict[str, Any]:
    """Trace-row fields of the change posterior after the latest block (issue 12, :mod:`workers.segmented`);
    none without challengers."""
    block = getattr(engine, "last_block", None)
    if not block:
        return {}
    return {"change_probability": block["change_probability"], "change_point": block["change_point"]}
