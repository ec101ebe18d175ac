"""A chunk -> processed blocks -> trace rows: the one path from the engine's block diagnostics to the
rows the worker commits (and the tests' reference traces are computed with)."""

from __future__ import annotations

import json
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


def layout(family: Any) -> tuple[Any, ...]:
    """What a family's ``validate`` reads besides the chunk: the family's class, its observation schema (the
    ``y`` shape or label classes, the stream's ``x`` width) and the stream columns it keeps (``params.selected``
    of the covariate families).  So two models of one layout read a stream entry as the same tensors, as every
    family of ``models.FAMILIES`` validates (gmm: ``y: [B, dim]``; autoregressive: ``y: [B]``; linear and
    logistic regression, bnn: ``x: [B, columns]`` then its selected columns, ``y`` by the schema's ``y``)."""
    selected = getattr(family.params, "selected", None)
    return (
        type(family),
        json.dumps(family.observation_schema(), sort_keys=True),
        None if selected is None else tuple(selected),
    )


class RoundChunks:
    """The stream entries of one round of the worker (``Worker.absorb_round``), decoded once per entry and
    validated once per entry and :func:`layout`: the models of one stream share the tensors, where each decoded
    and validated its own copy before (25 µs per model and chunk of a 1-D gmm, ``bench/many_models.py``).
    Sharing holds because no engine writes its input in place (``tests/workers/test_shared_chunks.py``)."""

    def __init__(self) -> None:
        self._decoded: dict[tuple[str, bytes], tuple[Any, Any]] = {}
        self._validated: dict[tuple[str, bytes, tuple[Any, ...]], tuple[Any, Any]] = {}

    def get(self, log: str, entry_id: bytes, fields: dict[bytes, bytes], family: Any, kind: tuple[Any, ...]) -> Any:
        """``(x: [B, d] | None, y: [B, ...])`` of entry ``entry_id`` (raw ``fields``) of stream log ``log`` as
        ``family`` (of layout ``kind``) validates it.  A failure raises and is not kept (each model of the entry
        fails with its own family's error)."""
        got = self._validated.get((log, entry_id, kind))
        if got is None:
            raw = self._decoded.get((log, entry_id))
            if raw is None:
                raw = self._decoded[(log, entry_id)] = records.decode_chunk(fields)
            got = self._validated[(log, entry_id, kind)] = family.validate(*raw)
        return got


def change_fields(engine: Any) -> dict[str, Any]:
    """Trace-row fields of the change posterior after the latest block (issue 12, :mod:`workers.segmented`);
    none without challengers."""
    block = getattr(engine, "last_block", None)
    if not block:
        return {}
    return {"change_probability": block["change_probability"], "change_point": block["change_point"]}
