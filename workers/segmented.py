"""A model's engine with challengers: Bayesian online change points on ``ModelEngine``'s public API.

:class:`SegmentedEngine` wraps the model's main :class:`~workers.engine.ModelEngine` (the population
of the current segment) and up to ``max_challengers`` fresh copies of it (same family, prior and
sampler but a lower conditional-ESS target, :func:`workers.changepoint.challenger_ess_target`; own seeds from
:func:`workers.changepoint.challenger_seed`), each started at a candidate
change point and absorbing the stream from there.  After every block it computes the change
posterior (:mod:`workers.changepoint`), and when the probability of a change exceeds the threshold
it raises a ``change_point`` alert and the most probable challenger becomes the main population.

Reported quantities (what the runner stores and the API serves):

* ``observations``: stream values absorbed (as for a plain engine).
* ``log_evidence``: ``log p(y_{1..n} | τ₁, …, τ_k)``, the log-evidence of the model given the
  confirmed change points τ (the segments between them with independent parameters from the prior,
  the change points themselves treated as known; no hazard term): the sum of each segment's
  ``log Ẑ``.  With no confirmed change it is the plain running ``log Ẑ``.  At a confirmation it
  jumps by the winner's log Bayes factor (the block's row says ``change_point: true``).
* ``log_evidence_se``: its Monte Carlo standard error, ``sqrt(offset_var + Var(log Ẑ_main))``.  The
  segments' estimates come from independent runs (the challengers have their own seeds), so their
  variances add: ``offset_var`` sums each confirmed segment's ``Var(log Ẑ)`` at its end (the base of
  the winner, :attr:`workers.state.SGAISState.log_evidence_var` of the population that scored it).
  The change points themselves are treated as known, as for ``log_evidence``.
* ``degraded``: the main engine's reason, else that of a closed segment: its population was flagged, or the values
  of the block where its change was placed were scored with importance weights of ESS below :data:`PREFIX_ESS` of
  the particles (:meth:`SegmentedEngine._confirm`).
* the checkpoint ``state`` (:meth:`to_bytes`) is the main engine's: the current segment's
  population, so its posterior summary is the posterior of the new segment's parameters.

The challengers and the segment bookkeeping go in a second checkpoint field
(:meth:`changepoint_bytes`, restored by :meth:`restore`); a checkpoint without it (written before
this module) restores as a model without challengers and no change so far.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from models.stack import StackedFamily, stack_key_of
from workers import changepoint as cp
from workers.engine import ModelEngine
from workers.history import History
from workers.settings import SamplerSettings
from workers.stacking import absorb_context, advance_stack, init_states, normalised, rows_between
from workers.state import BlockInfo

FORMAT = 1
log = logging.getLogger(__name__)
# below this ESS fraction the importance estimate of a closed segment's last values (those inside the block where the
# change was placed, SegmentedEngine._locate) is not certified: on the demo's series (blocks of 50, 50 particles)
# prefixes of 20-37 values scored at an ESS of 1 of 50 put the closed segment 33-40 nats below its exact evidence
# (session 21); the sampler's own annealing steps keep each step's conditional ESS at 0.9 (0.5 for challengers)
PREFIX_ESS = 0.5


@dataclass
class Challenger:
    """A fresh copy of the model started at stream index ``start``."""

    start: int  # stream index of the first observation it scores
    skip: int  # stream values before its first absorbed one (start − the conditioned-on context)
    base: float  # the main segment's log Ẑ(y_{s..start−1}) (nats)
    seed: int
    engine: ModelEngine
    absorbed: int = 0  # stream values scored since start
    bases: dict[int, float] = field(default_factory=dict)  # other challengers' log Ẑ' at start, by their start
    base_var: float = 0.0  # Var(base) (nats²)
    base_vars: dict[int, float] = field(default_factory=dict)  # Var of each of ``bases``
    # ESS fraction of the importance weights of the rows of ``base`` inside the start's block (1: none there), and
    # that of each of ``bases`` (SegmentedEngine._confirm flags a closed segment scored by too few particles)
    base_ess: float = 1.0
    bases_ess: dict[int, float] = field(default_factory=dict)


def skip_observations(chunks: Iterable[tuple[Any, Any]], k: int) -> Iterator[tuple[Any, Any]]:
    """The stream's ``(x, y)`` chunks without its first ``k`` values (rows along dim 0)."""
    for x, y in chunks:
        n = len(y)
        if k >= n:
            k -= n
            continue
        yield (x[k:] if x is not None else None), y[k:]
        k = 0


@dataclass
class _Step:
    """One block of one :class:`SegmentedEngine` in :func:`advance_blocks`."""

    seg: SegmentedEngine
    first: int  # stream index of the block's first value
    xb: Any
    yb: Any
    jobs: list[ModelEngine] = field(default_factory=list)  # the populations absorbing the block, main first
    # the populations' states before the block, main first (their log Ẑ and Var(log Ẑ) are read from these when a
    # challenger starts, not every block)
    states: list[Any] = field(default_factory=list)
    failed: set[int] = field(default_factory=set)  # id() of the challengers' engines that failed on the block
    alive: list[tuple[Challenger, Any]] = field(default_factory=list)  # live challengers and their states
    spawn: Challenger | None = None  # a challenger started in this block
    spawn_k: int = 0  # its first row in the block (it absorbs rows spawn_k..)
    spawn_context: tuple[Any, Any] | None = None  # the values before its start it conditions on (x | None, y)
    tail_only: bool = False  # starts a challenger only if the block's rows from the split drop (_after_main)
    info: BlockInfo | None = None  # the main population's
    value: float = math.nan  # its per-observation log-predictive (nats)

    def live_state(self, j: int) -> Any:
        """Population ``j``'s state before the block in :func:`_locate`'s order: the main's for 0, else that of
        live challenger ``j − 1`` (:attr:`alive`: the challengers that did not fail on the block)."""
        return self.states[0] if j == 0 else self.alive[j - 1][1]


#: :func:`_locate`'s answer for one block: the start's row ``k``, each population's log-predictive of the rows before
#: it (nats), the tail's (mean per-row log-predictive, rows) and each population's ESS fraction
Located = tuple[int, list[float], tuple[float, int], list[float]]


def ramp_bounds(first: int, n: int) -> list[tuple[int, int]]:
    """``(start, stop)`` offsets of the sub-blocks a block of ``n`` values starting at stream index ``first`` is
    absorbed in: cut so that no sub-block holds more values than the stream before it (the first value aside),
    i.e. at ``first``'s doublings 2·first, 4·first, … (1, 2, 4, 8, … for a block at the stream's start).

    Why: a challenger may start only in a block after the segment's first (before it the main population is the
    prior, whose predictive cannot place a change, :func:`_locate`), and only from the population's predictive
    before the block.  Cut this way, a change among a stream's first values sits in a sub-block whose population
    has seen at least as many values as the sub-block holds, whatever the chunking: posted in one chunk of 50, a
    shift at 28 is found at 28 (sub-block 16-32), as with chunks of one (``tests/workers/test_changepoint.py``).
    A block no longer than the values before it is not cut, so a steady feed of small chunks pays nothing after
    its first chunk: cutting at every power of two below ``block_size`` (the first version) cost a feed of 5-value
    chunks four extra blocks in its first 100 values, about a fifth more work there (``bench/many_models.py``).
    """
    cuts, a = [0], first
    while a + 1 < first + n and first + n > 2 * a:
        a = max(2 * a, a + 1)
        cuts.append(a - first)
    cuts.append(n)
    return list(zip(cuts[:-1], cuts[1:], strict=False))


def _merged(a: BlockInfo, b: BlockInfo) -> BlockInfo:
    """One block's diagnostics from those of two consecutive sub-blocks ``a`` then ``b``."""
    return b._replace(
        observations=a.observations + b.observations,
        log_predictive=a.log_predictive + b.log_predictive,
        annealing_steps=a.annealing_steps + b.annealing_steps,
        resampled=a.resampled or b.resampled,
        guard_tripped=a.guard_tripped or b.guard_tripped,
        reannealed=a.reannealed or b.reannealed,
        log_evidence_correction=a.log_evidence_correction + b.log_evidence_correction,
    )


def advance_blocks(
    engines: Sequence[SegmentedEngine],
    blocks: Sequence[tuple[Any, Any]],
    *,
    heartbeat: Callable[[], None] | None = None,
) -> list[BlockInfo | Exception]:
    """Absorb one validated block ``blocks[i] = (x: [B, d] | None, y: [B, ...])`` (``B ≤ block_size``) into
    each ``engines[i]``: every main population and every challenger of every engine in ONE
    :func:`~workers.stacking.advance_stack` call (models of one stack key share one kernel call), then the
    challengers that a drop of the log-predictive starts at this block in a second one.  With challengers, a block
    among the stream's first ``block_size`` values is absorbed in the sub-blocks of :func:`ramp_bounds` (the
    engines' sub-blocks ``j`` in one round of such calls), and its diagnostics are their sum (:func:`_merged`;
    ``last_block["change_point"]`` true when any sub-block confirmed a change).

    Each population's bits are those it gets alone (``advance_stack``), so engine ``i`` ends exactly as
    ``engines[i].update(*blocks[i])`` alone would leave it.  The result of engine ``i`` is its block's
    :class:`BlockInfo` (``log_evidence`` the reported one), or the exception that stopped it (a
    :class:`~workers.sgais.NumericalError` of its main population or of a challenger); the others are
    unaffected.  A failed engine is to be discarded (its populations that did absorb the block keep it).
    """
    parts = [
        ramp_bounds(seg.observations, int(yb.shape[0])) if seg.cp.enabled else [(0, None)]
        for seg, (_, yb) in zip(engines, blocks, strict=True)
    ]
    out: list[BlockInfo | Exception | None] = [None] * len(engines)
    changed = [False] * len(engines)
    for j in range(max(len(p) for p in parts)):
        idx = [k for k, p in enumerate(parts) if j < len(p) and not isinstance(out[k], Exception)]
        sub = []
        for k in idx:
            (xb, yb), (a, b) = blocks[k], parts[k][j]
            sub.append((rows_between(xb, a, b), rows_between(yb, a, b)))
        for k, res in zip(idx, _advance_once([engines[k] for k in idx], sub, heartbeat), strict=True):
            prev = out[k]
            out[k] = _merged(prev, res) if isinstance(prev, BlockInfo) and isinstance(res, BlockInfo) else res
            changed[k] = changed[k] or bool(engines[k].last_block.get("change_point"))
    for k, seg in enumerate(engines):
        if changed[k]:
            seg.last_block["change_point"] = True
        for eng in (seg.main, *(c.engine for c in seg.challengers)):
            eng.block_likelihoods = None  # read by _locate within the call; not kept ([K, M, B] per stack)
    return out  # type: ignore[return-value]


def _advance_once(
    engines: Sequence[SegmentedEngine], blocks: Sequence[tuple[Any, Any]], heartbeat: Callable[[], None] | None
) -> list[BlockInfo | Exception]:
    """:func:`advance_blocks` of one (sub-)block per engine, without the ramp."""
    steps: list[_Step | None] = []
    out: list[BlockInfo | Exception | None] = [None] * len(engines)
    for k, (seg, (xb, yb)) in enumerate(zip(engines, blocks, strict=True)):
        try:  # a failure of one engine before the stacked call is that engine's result
            steps.append(seg._before_block(seg.observations, xb, yb))
        except Exception as err:
            steps.append(None)
            out[k] = err
    live = [(k, st) for k, st in enumerate(steps) if st is not None]
    _stacked([(k, st, e, (st.xb, st.yb)) for k, st in live for e in st.jobs], out, heartbeat)
    due: list[tuple[int, _Step, list[Any]]] = []  # the engines whose block starts a challenger, its populations
    for k, st in live:
        info = out[k]
        if isinstance(info, BlockInfo) and st.seg.cp.enabled:
            try:
                states = st.seg._after_main(st, info)
            except Exception as err:
                out[k] = err
                continue
            if states is not None:
                due.append((k, st, states))
    due = _tails_checked(due, out)
    located = _locate_each([(st.seg, states, st.xb, st.yb) for _, st, states in due])
    annealed = _annealed_prefixes([(st, where) for (_, st, _), where in zip(due, located, strict=True)])
    spawns = _started(due, located, annealed, out)
    _stacked(spawns, out, heartbeat)
    for k, st in live:
        info = out[k]
        if isinstance(info, BlockInfo):
            try:
                if st.seg.cp.enabled:
                    st.seg._after_block(st)
                out[k] = info._replace(
                    log_evidence=st.seg.log_evidence, log_evidence_se=st.seg.log_evidence_se, degraded=st.seg.degraded
                )
            except Exception as err:
                out[k] = err
    assert all(v is not None for v in out)
    return out  # type: ignore[return-value]


def _started(
    due: list[tuple[int, _Step, list[Any]]], located: list[Any], annealed: list[Any], out: list[Any]
) -> list[tuple[int, _Step, ModelEngine, tuple[Any, Any]]]:
    """The challengers of ``due`` started where :func:`_locate` placed them (:meth:`SegmentedEngine._spawn`), their
    prior populations drawn in one batch (:func:`workers.stacking.init_states`, each from its own generator: the
    bits it gets alone): ``(engine k, step, challenger, the rows it absorbs)`` each.  An engine whose start fails
    gets its exception in ``out``."""
    new: list[tuple[int, _Step, ModelEngine]] = []
    for (k, st, _), where, prefix in zip(due, located, annealed, strict=True):
        try:
            if isinstance(where, Exception):
                raise where
            new.append((k, st, st.seg._spawn(st, where[0], where[1], where[3], prefix).engine))
        except Exception as err:
            out[k] = err
    spawns = []
    for (k, st, eng), state in zip(
        new, init_states([(e.generator, e.family, e.settings) for _, _, e in new]), strict=True
    ):
        try:
            if isinstance(state, Exception):
                raise state
            st.seg._start_challenger(st, state)
        except Exception as err:
            out[k] = err
            continue
        j = st.spawn_k
        spawns.append((k, st, eng, (st.xb[j:] if st.xb is not None else None, st.yb[j:])))
    return spawns


def _annealed_prefixes(requests: list[tuple[_Step, Any]]) -> list[list[tuple[float, float] | None]]:
    """Per ``(step, where)`` (``where``: :func:`_locate`'s answer for the step's block, or its exception), each live
    population's ``(log Ẑ, Var log Ẑ)`` up to the start by SGAIS (:meth:`SegmentedEngine._prefix_copy`; main first,
    then the step's live challengers), where its importance weights' ESS is below :data:`PREFIX_ESS`; else None.
    The main population's closes its segment if the new challenger wins; a live challenger's closes that challenger's
    segment if it wins first and the new one is then confirmed against it (:meth:`SegmentedEngine._confirm` re-bases
    the later challengers).  Session 31, the demo's gmm1 on its seven series: the four segments closed by a re-based
    challenger, scored by importance weights of ESS 0.03-0.15, were 0.5-3.4 nats low at 6-32 of their standard
    errors; the eighteen scored by SGAIS within 1.5 of theirs but one (3).  The copies absorb their rows in one
    :func:`~workers.stacking.advance_stack` call (each gets the bits it gets alone)."""
    out: list[list[tuple[float, float] | None]] = [
        [None] * (len(where[3]) if not isinstance(where, Exception) else 0) for _, where in requests
    ]
    copies: list[tuple[int, int, ModelEngine]] = []
    blocks = []  # each copy's rows: the block's before the start
    for i, (st, where) in enumerate(requests):
        if isinstance(where, Exception):
            continue
        k = where[0]
        for j, ess in enumerate(where[3]):
            if ess >= PREFIX_ESS:
                continue
            eng = st.seg._prefix_copy(st, k, j)
            if eng is not None:
                copies.append((i, j, eng))
                blocks.append((st.xb[:k] if st.xb is not None else None, st.yb[:k]))
    try:
        results = advance_stack([e for _, _, e in copies], blocks, validated=True) if copies else []
    except Exception as err:  # not a sampler's failure (those are per copy): every importance estimate stands
        log.warning("scoring the closed segments' last values failed (%s)", err)
        return out
    for (i, j, eng), res in zip(copies, results, strict=True):
        st, k = requests[i][0], requests[i][1][0]
        if isinstance(res, Exception):  # e.g. the copy's SGHMC diverged: the importance estimate stands, with its flag
            log.warning("change at %d: scoring the closed segment's last values failed (%s)", st.first + k, res)
        elif not (eng.degraded and not st.live_state(j).degraded):  # flagged by the copy's own checks: not used
            out[i][j] = (eng.log_evidence, eng._st.log_evidence_var)
    return out


def _tails_checked(due: list[tuple[int, _Step, list[Any]]], out: list[Any]) -> list[tuple[int, _Step, list[Any]]]:
    """The engines of ``due`` that start a challenger: a block that neither reached the grid nor dropped as a whole
    starts one only if its rows from the split drop (:meth:`SegmentedEngine._tail_drops`; the main population's
    predictive alone decides, in one stacked :func:`_locate` call; every population's then places the start).  An
    engine whose check fails gets its exception in ``out``."""
    tails = [(k, st, states) for k, st, states in due if st.tail_only]
    checked = _locate_each([(st.seg, states[:1], st.xb, st.yb) for _, st, states in tails], prefixes=False)
    for (k, st, _), where in zip(tails, checked, strict=True):
        try:
            if isinstance(where, Exception):
                raise where
            st.tail_only = not st.seg._tail_drops(st, where[2])
        except Exception as err:
            out[k] = err
    return [(k, st, states) for k, st, states in due if not st.tail_only and not isinstance(out[k], Exception)]


def _stacked(
    jobs: list[tuple[int, _Step, ModelEngine, tuple[Any, Any]]], out: list[Any], heartbeat: Callable[[], None] | None
) -> None:
    """One :func:`advance_stack` call over ``jobs`` (engine ``k``'s step, a population, the rows it absorbs):
    ``out[k]`` becomes the main population's error or BlockInfo; a challenger that fails is noted in the step's
    ``failed`` (it is dropped: one candidate fewer, nothing it computed is reported)."""
    results = advance_stack([e for _, _, e, _ in jobs], [b for _, _, _, b in jobs], validated=True, heartbeat=heartbeat)
    for (k, st, e, _), res in zip(jobs, results, strict=True):
        if e is not st.seg.main:
            if isinstance(res, Exception):
                st.failed.add(id(e))
        elif isinstance(res, Exception):
            out[k] = out[k] if isinstance(out[k], Exception) else res
        elif out[k] is None:
            out[k] = res[0]


def _locate_each(
    requests: list[tuple[SegmentedEngine, list[Any], Any, Any]], *, prefixes: bool = True
) -> list[Located | Exception]:
    """:func:`_locate` of all the requests at once; if that fails, of each alone, so that the failure is that
    engine's result (its exception) and the others are unaffected."""
    try:
        return list(_locate(requests, prefixes=prefixes))
    except Exception:
        out: list[Located | Exception] = []
        for req in requests:
            try:
                out += _locate([req], prefixes=prefixes)
            except Exception as err:
                out.append(err)
        return out


def _locate(requests: list[tuple[SegmentedEngine, list[Any], Any, Any]], *, prefixes: bool = True) -> list[Located]:
    """For each ``(engine, states, xb, yb)``: where in the block a challenger started at it most probably starts,
    each population's log-predictive of the block's values before it (nats; ``states``: the populations'
    states before the block, main first), and the main population's mean per-row log-predictive of the values from
    there on with their count (the block's "tail", nats and rows), and the ESS fraction of each population's
    importance weights of the rows before it (1.0 when there are none).

    Each population's one-step predictive of every row from its particles before the block,
    ``log p̂(y_i | y_{<f}) = logsumexp_m(log w̄_m + log p(y_i | θ_m))`` (the first annealing increment,
    thesis eq. 4.6), gives the start ``k`` by a least-squares split (:func:`split_rows`: before ``k``
    at the segment's median per-observation log-predictive, from ``k`` at the rows' own level).
    The populations' evidences of ``y_f … y_{f+k−1}`` are the importance estimates
    ``logsumexp_m(log w̄_m + Σ_{i<k} log p(y_i | θ_m))``, so that a challenger started mid-block is
    compared on exactly the observations it did not see.  Blocks of one value give ``k = 0``.
    The likelihoods ``log p(y_i | θ_m)`` of every population of every request are evaluated in one stacked call
    per stack key and shape (each population's values are those it gets alone).  Without ``prefixes`` (the tail
    check, which reads only the start and the tail) every population's log-predictive is 0 and its ESS 1.
    """
    rows = _block_likelihoods(requests)
    # the split of each block from its main population's predictive, every request of one shape at once
    k_of: dict[int, int] = {}
    tail_of: dict[int, tuple[float, int]] = {}
    mains: dict[tuple[Any, ...], list[int]] = {}
    for r, (_, states, _, yb) in enumerate(requests):
        if int(yb.shape[0]) > 1:
            mains.setdefault((tuple(rows[(r, 0)][0].shape), states[0].theta.dtype), []).append(r)
    with torch.no_grad():
        for rs in mains.values():
            ll = torch.stack([rows[(r, 0)][0] for r in rs])  # [N, M, R]
            lw = normalised(torch.stack([requests[r][1][0].log_w for r in rs]))
            lp = torch.logsumexp(lw[:, :, None] + ll, 1)  # [N, R]
            levels = [requests[r][0]._split_level() for r in rs]
            R = int(lp.shape[1])
            # each tail's mean log-predictive from one read of the device (math.fsum: the correctly rounded sum,
            # whatever the stack); it only decides whether the tail drops (SegmentedEngine._tail_drops)
            for r, split, lp_r in zip(rs, split_rows(lp, levels), lp.tolist(), strict=True):
                k_of[r] = rows[(r, 0)][1] + split
                if split < R:
                    tail_of[r] = (math.fsum(lp_r[split:]) / (R - split), R - split)
    prefix = _prefix_estimates(requests, rows, k_of) if prefixes else {}
    out: list[Located] = []
    for r, (_, states, _, yb) in enumerate(requests):
        if int(yb.shape[0]) <= 1:
            out.append((0, [0.0] * len(states), (math.nan, 0), [1.0] * len(states)))
            continue
        got = [prefix.get((r, j), (0.0, 1.0)) for j in range(len(states))]
        out.append((k_of[r], [v for v, _ in got], tail_of.get(r, (math.nan, 0)), [e for _, e in got]))
    return out


def _block_likelihoods(
    requests: list[tuple[SegmentedEngine, list[Any], Any, Any]],
) -> dict[tuple[int, int], tuple[torch.Tensor, int]]:
    """(request, population) -> ``(log p(y_i | θ_m): [M, R], offset)`` for :func:`_locate`'s requests of more than
    one row: the rows the population's first annealing step evaluated (:attr:`ModelEngine.block_likelihoods`, the
    same values), or where it has none for these particles one stacked evaluation per stack key and shape (each
    population's values are those it gets alone); ``offset``: the block's values taken into the context at the
    stream's start.  Population ``j`` of a request is ``[main, *challengers][j]`` (:meth:`SegmentedEngine._after_main`
    keeps them in the states' order; the particles' identity is checked)."""
    rows: dict[tuple[int, int], tuple[torch.Tensor, int]] = {}
    groups: dict[tuple[Any, ...], list[tuple[tuple[int, int], Any, torch.Tensor, Any, torch.Tensor, int]]] = {}
    for r, (seg, states, xb, yb) in enumerate(requests):
        if int(yb.shape[0]) <= 1:
            continue
        dtype = states[0].theta.dtype  # every population has the model's sampler settings
        engines = [seg.main, *(c.engine for c in seg.challengers)]
        for j, st in enumerate(states):
            done = engines[j].block_likelihoods if j < len(engines) else None
            if done is not None and done.theta is st.theta:
                rows[(r, j)] = (done.rows, int(yb.shape[0]) - int(done.rows.shape[-1]))
                continue
            xr, yr, _ = seg.family.prepare(xb, yb, st.context)
            off = int(yb.shape[0]) - int(yr.shape[0])  # values taken into the context at the stream's start
            dev = st.theta.device  # the chunk's values arrive on the CPU
            x1 = xr.to(dtype=dtype, device=dev) if xr is not None else None
            key = (stack_key_of(seg.family), tuple(st.theta.shape), tuple(yr.shape), x1 is None, dtype, str(dev))
            groups.setdefault(key, []).append(((r, j), seg.family, st.theta, x1, yr.to(dtype=dtype, device=dev), off))
    with torch.no_grad():
        for group in groups.values():
            dtype, device = group[0][2].dtype, group[0][2].device
            fam = StackedFamily([g[1] for g in group], dtype, device) if len(group) > 1 else None
            if fam is None:  # the sampler's lean evaluation, a stack of one
                fam = StackedFamily.of(group[0][1], dtype, device)
            x = torch.stack([g[3] for g in group]) if group[0][3] is not None else None
            ll = fam.log_likelihood(torch.stack([g[2] for g in group]), x, torch.stack([g[4] for g in group]))
            for i, g in enumerate(group):
                rows[g[0]] = (ll[i], g[5])
    return rows


def _prefix_estimates(
    requests: list[tuple[SegmentedEngine, list[Any], Any, Any]],
    rows: dict[tuple[int, int], tuple[torch.Tensor, int]],
    k_of: dict[int, int],
) -> dict[tuple[int, int], tuple[float, float]]:
    """(request, population) -> the importance estimate ``logsumexp_m(log w̄_m + Σ_{i<n} log p(y_i | θ_m))`` of
    the block's ``n`` rows before the start ``k_of[request]`` (nats) and the ESS fraction of its weights, for the
    populations with ``n > 0``; one batched evaluation per shape and ``n``."""
    prefix: dict[tuple[int, int], tuple[float, float]] = {}
    todo: dict[tuple[Any, ...], list[tuple[int, int]]] = {}
    for r, (_, states, _, yb) in enumerate(requests):
        if int(yb.shape[0]) <= 1:
            continue
        for j, st in enumerate(states):
            ll, off = rows[(r, j)]
            n = k_of[r] - off
            if n > 0:
                todo.setdefault((tuple(ll.shape), st.theta.dtype, n), []).append((r, j))
    with torch.no_grad():
        for (_, _, n), pops in todo.items():
            ll = torch.stack([rows[rj][0] for rj in pops])[:, :, :n].sum(-1)  # [N, M]
            lv = normalised(torch.stack([requests[r][1][j].log_w for r, j in pops])) + ll
            w = torch.softmax(lv, -1)
            ess = [v / int(w.shape[-1]) for v in (1.0 / (w * w).sum(-1)).tolist()]
            prefix.update(zip(pops, zip(torch.logsumexp(lv, -1).tolist(), ess, strict=True), strict=True))
    return prefix


@functools.lru_cache(maxsize=1024)
def _challenger_sampler(model: SamplerSettings, cps: cp.ChangepointSettings, ess_target: float) -> SamplerSettings:
    """The sampler settings of a model's challengers but their seed, from the model's (validated once per distinct
    settings: a round's new challengers of many models share them)."""
    over: dict[str, Any] = {"ess_target": ess_target}
    over["burn_in"] = cps.burn_in if cps.burn_in is not None else math.ceil(cps.burn_in_fraction * model.burn_in)
    # a challenger is in its own warm-up, where its moves scale with the dimension like the model's
    # (workers.stacking.warmup_burn_in): a confirmed challenger's population becomes the model's, and with the
    # cheaper moves alone the thesis stream's in-order gmm-7 (20 parameters) ended 314 nats lower in the one
    # run compared (bench/README.md, "Warm-up burn-in")
    # no restarts from the prior (workers.stacking._restart_begin): like the lower ESS target, a challenger's
    # log Ẑ' only needs to be good against the confirmation level, and its second block is nearly always as large
    # as its history: with restarts a live 5-value feed of a one-component gmm took 45% more engine time
    # (12 restarts in 20 blocks, 9 of them challengers'; session 31).  A confirmed challenger gets the model's back.
    over["restart_min_rows"] = None
    return SamplerSettings.model_validate({**model.model_dump(), **over})


@functools.lru_cache(maxsize=256)
def _bonferroni_level(spawn_z: float, m: int) -> float:
    """``z_m = Φ⁻¹(1 − Φ(−spawn_z)/m)``: the drop of the lowest of ``m`` candidate tails that is as rare as one
    block's drop of ``spawn_z`` (:meth:`SegmentedEngine._tail_drops`)."""
    normal = statistics.NormalDist()
    return normal.inv_cdf(1.0 - normal.cdf(-spawn_z) / m)


def split_rows(lp: torch.Tensor, levels: Sequence[float | None]) -> list[int]:
    """Per block ``i``, the row ``k`` where its per-row log-predictives ``lp[i]: [R]`` most probably change level:
    least squares with the rows before ``k`` at the level ``levels[i]`` (the segment's median per-observation
    log-predictive, :meth:`SegmentedEngine._split_level`) and the rows from ``k`` on at their own mean (``k = 0``:
    the whole block is new).  Where a block has no level yet (None: before any baseline block) the rows before
    ``k`` take their own mean too (the classic one-change split, ``k ≥ 1``).  ``lp: [N, R]``, all blocks of ``R``
    rows; each row's answer is that of a batch of one.

    A block of three rows or more never ends in a one-row tail (``k ≤ R − 2``): one low row at a block's end
    is an outlier as much as a change, and the next block tells them apart; a change at the last row is then
    placed one row early, or at the next block's start, one late.  Without this an AR(1) on the Nile posted in
    one chunk of 50 placed the change at 31 (its one extreme row ending the sub-block 16-32) instead of 28.
    Shrinking the rows before ``k`` towards their own mean (the median as one more row) placed it at 28 too,
    but lowered the leader's mean F1 in ``bench/changepoints.py --refresh`` over seeds 0-3 from 0.672 (this rule)
    to 0.655.
    """
    r = int(lp.shape[1])
    if r <= 1:
        return [0] * int(lp.shape[0])
    rev = torch.flip(lp, [1])
    s1 = torch.flip(torch.cumsum(rev, 1), [1])  # Σ_{i≥k} lp_i
    s2 = torch.flip(torch.cumsum(rev * rev, 1), [1])
    count = torch.arange(r, 0, -1, dtype=lp.dtype, device=lp.device)
    post = s2 - s1 * s1 / count  # squared error of rows k.. about their mean
    last = r - 1 if r <= 2 else r - 2  # the largest k allowed
    out = [0] * int(lp.shape[0])
    known = [i for i, v in enumerate(levels) if v is not None]
    if known:
        idx = torch.tensor(known, device=lp.device)
        med = torch.tensor([levels[i] for i in known], dtype=lp.dtype, device=lp.device)
        dev = (lp[idx] - med[:, None]) ** 2
        pre = torch.cat([lp.new_zeros((len(known), 1)), torch.cumsum(dev, 1)[:, :-1]], 1)
        for i, k in zip(known, torch.argmin((pre + post[idx])[:, : last + 1], 1).tolist(), strict=True):
            out[i] = k
    fresh = [i for i, v in enumerate(levels) if v is None]
    if fresh:
        idx = torch.tensor(fresh, device=lp.device)
        c1 = torch.cumsum(lp[idx], 1)[:, :-1]  # rows 0..k−1, k = 1..R−1
        c2 = torch.cumsum(lp[idx] * lp[idx], 1)[:, :-1]
        pre = c2 - c1 * c1 / torch.arange(1, r, dtype=lp.dtype, device=lp.device)
        for i, k in zip(fresh, torch.argmin((pre + post[idx, 1:])[:, :last], 1).tolist(), strict=True):
            out[i] = 1 + k
    return out


class SegmentedEngine:
    """The main engine plus its challengers (module docstring).

    Parameters
    ----------
    main : ModelEngine
        The model's engine (a fresh one, or restored).
    settings : ChangepointSettings
        Change-point settings; ``enabled=False`` makes this a plain pass-through.
    """

    def __init__(self, main: ModelEngine, settings: cp.ChangepointSettings | None = None):
        self.main = main
        self.cp = settings or cp.ChangepointSettings.model_validate({})
        self.seed = main.settings.seed  # the model's seed (challenger seeds derive from it)
        self.skipped = 0  # stream values before the main engine's first absorbed one
        self.offset = 0.0  # log-evidence of the stream before the current segment (nats)
        self.offset_var = 0.0  # its Monte Carlo variance (nats²)
        self.state = cp.initial_state(0, self.cp)
        self.challengers: list[Challenger] = []
        self.context: list[list[Any]] = []  # the last context_size stream rows [x, y] (x None w/o covariates)
        self.last_block: dict[str, Any] = {}  # change_probability etc. of the latest block
        self.pending: list[dict[str, Any]] = []  # alerts raised since take_alerts
        self.started = 0  # challengers started so far (Ville's bound: expected false alarms ≤ started·ρ(1−c)/c)
        # why a closed segment's log Ẑ (part of ``offset``) is not certified, or None (see ``degraded``)
        self.closed_degraded: str | None = None
        self._baseline_cache: tuple[list[float], list[int], tuple[float, float]] | None = None
        self._targets: dict[tuple[int, float], float] = {}  # _retarget's ESS targets by (particles, model's target)

    @classmethod
    def create(cls, family: str, params: dict, sampler: dict, settings: cp.ChangepointSettings | None = None):
        return cls(ModelEngine(family, params, sampler), settings)

    # ----- the engine's public API ------------------------------------------------------------
    @property
    def family(self):
        return self.main.family

    @property
    def settings(self):
        return self.main.settings

    @property
    def observations(self) -> int:
        return self.skipped + self.main.observations

    @property
    def log_evidence(self) -> float:
        """``log p(y_{1..n} | confirmed change points)`` (nats; module docstring)."""
        return self.offset + self.main.log_evidence

    @property
    def log_evidence_se(self) -> float:
        """Monte Carlo standard error of :attr:`log_evidence` (nats; module docstring)."""
        return math.sqrt(max(self.offset_var + self.main._st.log_evidence_var, 0.0))

    @property
    def ess(self) -> float:
        return self.main.ess

    @property
    def degraded(self) -> str | None:
        """Why :attr:`log_evidence` is not certified, or None: the main engine's :attr:`ModelEngine.degraded`, else
        that of the population that scored a closed segment.  The reported value sums every segment's log Ẑ, so a
        segment whose population was flagged leaves the sum flagged after the change that closed it: on the demo's
        Bitcoin series an AR(1) flagged by the score check confirmed a change at 587 and then reported 605.2 nats
        with status ``ok``, where the exact value given that change is 754.9 (session 21)."""
        return self.main.degraded or self.closed_degraded

    def posterior_summary(self) -> dict[str, Any]:
        return self.main.posterior_summary()

    def to_bytes(self, *, include_history: bool = True) -> bytes:
        return self.main.to_bytes(include_history=include_history)

    def view_bytes(self) -> bytes:
        """The main population's :meth:`ModelEngine.view_bytes` (the current segment's posterior)."""
        return self.main.view_bytes()

    def update(self, x: Any, y: Any, *, validated: bool = False, heartbeat: Callable[[], None] | None = None):
        """As :meth:`ModelEngine.update`; each BlockInfo's ``log_evidence`` is the reported one, and
        ``last_block`` / :meth:`take_alerts` give the block's change posterior and alerts.

        Raises
        ------
        workers.sgais.NumericalError
            From the main population or a challenger (the engine is then to be discarded: the populations
            that did absorb the block keep it).
        """
        if not validated:
            x, y = self.family.validate(x, y)
        infos = []
        size = self.settings.block_size
        for s in range(0, y.shape[0], size):
            xb, yb = (x[s : s + size] if x is not None else None), y[s : s + size]
            (info,) = advance_blocks([self], [(xb, yb)], heartbeat=heartbeat)
            if isinstance(info, Exception):
                raise info
            infos.append(info)
        return infos

    def take_alerts(self) -> list[dict[str, Any]]:
        out, self.pending = self.pending, []
        return out

    # ----- challengers ------------------------------------------------------------------------
    def _sampler(self, seed: int) -> SamplerSettings:
        """A challenger's sampler settings (:func:`_challenger_sampler`) with its own ``seed``."""
        model = self.main.settings  # the model's sampler (a confirmed challenger gets it back, _confirm)
        template = _challenger_sampler(model, self.cp, self._ess_target(model.initial_particles))
        return template.model_copy(update={"seed": seed})  # validated once per model settings: only the seed differs

    def _ess_target(self, particles: int) -> float:
        """A challenger's ESS target with ``particles`` (:func:`workers.changepoint.challenger_ess_target`)."""
        return cp.challenger_ess_target(self.cp, self.main.settings.ess_target, particles)

    def _retarget(self, eng: ModelEngine) -> None:
        """Set a challenger's ESS target for the particles it will have in its next block: the warm-up population
        is reduced to ``particles`` once ``warmup_observations`` have been absorbed
        (:func:`workers.stacking.reduce_particles`), where the target rises back towards the model's."""
        s, st = eng.settings, eng._st
        m = st.theta.shape[0]
        if m > s.particles and st.history.seen >= s.warmup_observations:
            m = s.particles
        key = (m, self.main.settings.ess_target)
        target = self._targets.get(key)
        if target is None:
            target = self._targets[key] = self._ess_target(m)
        if s.ess_target != target:
            eng.settings = s.model_copy(update={"ess_target": target})

    def _before_block(self, first: int, xb, yb) -> _Step:
        """The block's jobs before any population moves: the main population and every challenger (its ESS target
        set for the block, :meth:`_retarget`), with their states before the block (a challenger started in the
        block is placed after it, :func:`_locate`)."""
        step = _Step(self, first, xb, yb)
        step.jobs.append(self.main)
        if not self.cp.enabled:
            return step
        for c in self.challengers:
            self._retarget(c.engine)
        step.states = [self.main.state] + [c.engine.state for c in self.challengers]
        step.jobs += [c.engine for c in self.challengers]
        return step

    def _after_main(self, step: _Step, info: BlockInfo) -> list[Any] | None:
        """After the main population and the challengers absorbed the block: the challengers that failed are
        dropped; a challenger is due when the block dropped (``spawn_z``) or reached the geometric grid, and may be
        when a block of several rows did neither (``step.tail_only``: if its rows from the split drop,
        :meth:`_tail_drops`).  Returns the live populations' states before the block (main first), where
        :func:`_locate` places it, or None when no challenger starts."""
        step.info = info
        n = int(step.yb.shape[0])
        alive = [
            (c, s) for c, s in zip(self.challengers, step.states[1:], strict=True) if id(c.engine) not in step.failed
        ]
        self.challengers = [c for c, _ in alive]
        for c in self.challengers:
            c.absorbed += n
        rows = info.observations
        step.value = info.log_predictive / rows if rows > 0 else math.nan
        z = cp.drop_score(self.state, self.cp, step.value, rows, self._baseline())
        first = step.first
        if first <= self.state["segment_start"]:
            return None
        due = cp.grid_due(self.state, self.cp, first)
        step.alive = alive
        step.tail_only = not (due or z >= self.cp.spawn_z)
        if step.tail_only and (n <= 1 or len(self.state["values"]) < 2):
            return None  # one row: its drop is the block's; no baseline yet: no drop
        return [step.states[0]] + [s for _, s in alive]

    def _tail_drops(self, step: _Step, tail: tuple[float, int]) -> bool:
        """Whether a block that neither reached the grid nor dropped as a whole starts a challenger: when its rows
        from the split (:func:`_locate`), ``tail = (mean per-row log-predictive, rows)``, drop
        below the segment's baseline (:func:`workers.changepoint.drop_score`) by more than any of the block's
        ``m = max(R − 2, 1)`` candidate tails would by chance as often as one block drops ``spawn_z``: the
        Bonferroni level ``z_m = Φ⁻¹(1 − Φ(−spawn_z)/m)`` (2.43 for a 5-row block, 3.31 for 50 rows at
        ``spawn_z`` 2), since the split picks the lowest tail.

        Why: a change near a block's end moves the block's mean little (posted in chunks of 5, the Nile's shift at
        28, two of the block 25-29's values, started a challenger only in the next block, at 31, and a gmm confirmed
        31).  Why the corrected level: at ``spawn_z`` itself the tails started half again as many challengers on a
        stationary 5-value feed (``bench/changepoint_cost.py``) and cost 128 stacked gmm models 30% more worker time
        per block (``bench/many_models.py``).
        """
        m = max((step.info.observations if step.info is not None else 0) - 2, 1)
        return cp.drop_score(self.state, self.cp, *tail, self._baseline()) >= _bonferroni_level(self.cp.spawn_z, m)

    def _spawn(
        self,
        step: _Step,
        k: int,
        prefix: list[float],
        ess: list[float],
        annealed: list[tuple[float, float] | None] | None = None,
    ) -> Challenger:
        """The challenger started at row ``k`` of the block (:func:`_locate`; ``prefix``: each live population's
        log-predictive of the rows before it, nats, ``ess`` the ESS fraction of its importance weights); its prior
        population is drawn with the round's other new challengers (:func:`_started`), and it absorbs the block from
        there in a second stacked call.  ``annealed``: each live population's ``(log Ẑ, Var log Ẑ)`` up to the start
        by SGAIS, or None (:func:`_annealed_prefixes`), which replaces the importance estimate where given (its ESS
        then counts as 1: nothing to flag)."""
        alive = step.alive
        scored = [
            (s.log_evidence + p, s.log_evidence_var, e) if a is None else (a[0], a[1], 1.0)
            for s, p, e, a in zip(
                step.states[:1] + [s for _, s in alive], prefix, ess, annealed or [None] * len(prefix), strict=True
            )
        ]  # fmt: skip
        step.spawn_k = k
        base, base_var, base_ess = scored[0]
        bases = {c.start: v for (c, _), (v, _, _) in zip(alive, scored[1:], strict=True)}
        base_vars = {c.start: v for (c, _), (_, v, _) in zip(alive, scored[1:], strict=True)}
        step.spawn, step.spawn_context = self._new_challenger(
            step.first + k, k, base, base_var, bases, base_vars, step.xb, step.yb
        )
        step.spawn.base_ess = base_ess
        step.spawn.bases_ess = {c.start: e for (c, _), (_, _, e) in zip(alive, scored[1:], strict=True)}
        return step.spawn

    def _prefix_copy(self, step: _Step, k: int, j: int = 0) -> ModelEngine | None:
        """A copy of population ``j`` (0: the main, ``i + 1``: the step's live challenger ``i``) before the block, to
        score its segment's values up to row ``k`` of the block by SGAIS itself (:func:`_annealed_prefixes`, where the
        importance weights' ESS is below :data:`PREFIX_ESS`): its history copied back to that point, its own random
        stream :func:`workers.changepoint.challenger_seed` of ``−start − 1`` (from the population's own seed).  The
        importance estimate from the weights before the block (:func:`_locate`) degenerates over many rows: on the
        demo's series 20-37 values at an ESS of 1 of 50 particles put closed segments 33-40 nats low (session 21).
        The estimate stands (flagged by its ESS at confirmation) where this returns None: a reservoir history that
        has started replacing rows, or a copy that cannot be made; or where the copy fails or its own checks flag it
        (a population flagged before the block is that population's flag, which a confirmation keeps).  Run only
        where the ESS is low (where the value is flagged otherwise): at every start it cost 128 stacked gmm models
        26-73% more worker time per block (``bench/many_models.py``, session 21)."""
        pre = step.live_state(j)
        owner = self.main if j == 0 else step.alive[j - 1][0].engine
        seed = self.seed if j == 0 else step.alive[j - 1][0].seed
        hist = pre.history
        rows = int(step.info.observations if step.info is not None else 0)  # the block's likelihood rows (all alike)
        if hist.capacity is not None and hist.seen > hist.size:
            return None
        try:
            copy = History(capacity=hist.capacity, seed=seed, dtype=hist.dtype, device=hist.device)
            copy.load_state_tensors(hist.state_tensors(), seen=hist.seen)
            copy.truncate(hist.seen - rows)
            settings = owner.settings.model_copy(update={"seed": cp.challenger_seed(seed, -(step.first + k) - 1)})
            eng = ModelEngine(self.family, sampler=settings, _init_state=False)
            eng.state = pre._replace(history=copy)
            eng.observations = owner.observations - int(step.yb.shape[0])
            eng.evidence_var_since = owner.evidence_var_since
        except Exception as err:
            log.warning("change at %d: scoring the closed segment's last values failed (%s)", step.first + k, err)
            return None
        return eng

    def _new_challenger(
        self, start: int, k: int, base: float, base_var: float, bases: dict[int, float], base_vars, xb, yb
    ) -> tuple[Challenger, tuple[Any, Any] | None]:
        """A fresh challenger started at ``start`` = the block's first index + ``k``, without its population yet
        (:meth:`_start_challenger` gives it that and the conditioned-on context), and the values ``(x | None, y)``
        before ``start`` it conditions on (None without); ``base``/``bases``: the main population's and the other
        challengers' log Ẑ up to ``start`` (nats), ``base_var``/``base_vars`` their variances (nats²)."""
        seed = cp.challenger_seed(self.seed, start)
        eng = ModelEngine(self.family, sampler=self._sampler(seed), _init_state=False)  # drawn by _start_challenger
        ctx = self._context_rows(self.context, xb[:k] if xb is not None else None, yb[:k])
        challenger = Challenger(start, start - len(ctx), base, seed, eng, 0, bases, base_var, base_vars)
        if not ctx:
            return challenger, None
        cx = torch.tensor([r[0] for r in ctx], dtype=torch.float64) if ctx[0][0] is not None else None
        return challenger, (cx, torch.tensor([r[1] for r in ctx], dtype=torch.float64))

    def _start_challenger(self, step: _Step, state: Any) -> None:
        """The challenger started in ``step`` (:meth:`_spawn`) gets its prior population ``state``
        (:func:`workers.stacking.init_states`) and the conditioned-on values before its start (autoregressive: no
        likelihood rows)."""
        assert step.spawn is not None
        eng = step.spawn.engine
        eng.state = state
        if step.spawn_context is not None:
            absorb_context(eng, *step.spawn_context)

    def _split_level(self) -> float | None:
        """The level the rows before a block's change are held at (:func:`split_rows`): the segment's median
        per-observation log-predictive (nats), None before any baseline block."""
        base = self._baseline()
        return None if base is None else base[0]

    def _baseline(self) -> tuple[float, float] | None:
        """:func:`workers.changepoint.baseline` of the segment's recent blocks (None before any), computed once
        per block: :func:`workers.changepoint.push_baseline` replaces the lists rather than changing them, so the
        lists' identity tells whether the cached value is theirs (three callers a block read it)."""
        values, rows = self.state["values"], self.state["rows"]
        if not values:
            return None
        cached = self._baseline_cache
        if cached is None or cached[0] is not values or cached[1] is not rows:
            cached = self._baseline_cache = (values, rows, cp.baseline(values, rows, self.cp.noise_floor))
        return cached[2]

    def _after_block(self, step: _Step) -> None:
        """The change posterior after every population absorbed the block: alerts, confirmation, pruning."""
        xb, yb, n = step.xb, step.yb, int(step.yb.shape[0])
        last = step.first + n - 1
        lz = self.main.log_evidence
        spawned = None
        if step.spawn is not None and id(step.spawn.engine) not in step.failed:
            step.spawn.absorbed = n - step.spawn_k
            self.challengers.append(step.spawn)
            self.started += 1
            spawned = len(self.challengers) - 1
        self._remember_context(xb, yb)
        rows = step.info.observations if step.info is not None else 0
        cp.push_baseline(self.state, self.cp, step.value, rows)
        lbfs = [c.base + c.engine.log_evidence - lz for c in self.challengers]
        _, probs = cp.posterior(lbfs, self.cp.hazard)
        since = -math.inf if self.cp.window is None else last + 1 - self.cp.window
        p_change = sum(p for c, p in zip(self.challengers, probs, strict=True) if c.start >= since)
        eligible = [i for i, c in enumerate(self.challengers) if c.absorbed >= self.cp.min_age and c.start >= since]
        p_confirm = sum(probs[i] for i in eligible)
        self.last_block = {"change_probability": p_change, "change_point": False, "challengers": len(lbfs)}
        if eligible and p_confirm > self.cp.threshold:
            # confirmed only if it holds with each log B̂ lowered by confirm_z standard errors (cp module docstring)
            ses = [self._log_bayes_factor_se(c) for c in self.challengers]
            _, low = cp.posterior([b - self.cp.confirm_z * se for b, se in zip(lbfs, ses, strict=True)], self.cp.hazard)
            if sum(low[i] for i in eligible) > self.cp.threshold:
                w = max(eligible, key=lambda i: probs[i])
                self._confirm(self.challengers[w], p_confirm, lbfs[w], ses[w], last)
                return
        ages = [c.absorbed for c in self.challengers]
        keep = cp.prune([c.start for c in self.challengers], ages, lbfs, self.cp, spawned)
        self.challengers = [self.challengers[i] for i in keep]
        live = {c.start for c in self.challengers}
        for c in self.challengers:
            c.bases = {s: v for s, v in c.bases.items() if s in live}
            c.base_vars = {s: v for s, v in c.base_vars.items() if s in live}
            c.bases_ess = {s: v for s, v in c.bases_ess.items() if s in live}

    def _log_bayes_factor_se(self, c: Challenger) -> float:
        """Monte Carlo standard error of challenger ``c``'s log Bayes factor (nats; cp module docstring): its own
        log-evidence variance plus the main population's since ``c.start``."""
        var = c.engine._st.log_evidence_var + self.main._st.log_evidence_var - c.base_var
        return math.sqrt(max(var, 0.0))

    def _confirm(self, win: Challenger, probability: float, log_bf: float, log_bf_se: float, last: int) -> None:
        """``win`` becomes the main population of a segment starting at ``win.start``."""
        self.pending.append(
            {
                "kind": "change_point",
                "observation_index": win.start,
                "detected_at_index": last,
                "score": probability,
                "probability": probability,
                "log_bayes_factor": log_bf,
                "message": (
                    f"change at {win.start}: posterior probability {probability:.3g}, "
                    f"log Bayes factor {log_bf:.3g} ± {log_bf_se:.2g} nats (hazard {self.cp.hazard:g})"
                ),
            }
        )
        self.last_block["change_point"] = True
        if self.closed_degraded is None and self.main.degraded:
            self.closed_degraded = f"the segment before the change at {win.start}: {self.main.degraded}"
        if self.closed_degraded is None and win.base_ess < PREFIX_ESS:
            self.closed_degraded = (
                f"the segment before the change at {win.start}: its last values, inside the block of the change, "
                f"moved its population further than one annealing step may (importance weights of ESS "
                f"{win.base_ess:.2f} of the particles, below {PREFIX_ESS}): not certified"
            )
        self.offset += win.base
        self.offset_var += win.base_var
        self.skipped = win.skip
        # the new segment's population keeps the model's sampler settings (its own seed)
        win.engine.settings = self.main.settings.model_copy(update={"seed": win.seed})
        self.main = win.engine
        rest = [c for c in self.challengers if c.start > win.start and win.start in c.bases]
        for c in rest:
            c.base = c.bases.pop(win.start)
            c.base_var = c.base_vars.pop(win.start, 0.0)
            c.base_ess = c.bases_ess.pop(win.start, 1.0)
        self.challengers = rest
        self.state = cp.initial_state(win.start, self.cp)

    def _context_rows(self, context: list[list[Any]], xb, yb) -> list[list[Any]]:
        """The last ``context_size`` stream rows ``[x, y]`` after ``context`` then the block's values."""
        k = self.family.context_size
        if k <= 0:
            return []
        rows = [[None if xb is None else xb[i].tolist(), yb[i].tolist()] for i in range(int(yb.shape[0]))]
        return (context + rows)[-k:]

    def _remember_context(self, xb, yb) -> None:
        self.context = self._context_rows(self.context, xb, yb)

    # ----- checkpoint -------------------------------------------------------------------------
    def changepoint_bytes(self) -> bytes:
        """The challengers and segment bookkeeping: a JSON header (length-prefixed) then each
        challenger's ``to_bytes(include_history=False)`` (histories are rebuilt from the stream log)."""
        blobs = [c.engine.to_bytes(include_history=False) for c in self.challengers]
        header = {
            "format": FORMAT,
            "seed": self.seed,
            "skipped": self.skipped,
            "offset": self.offset,
            "offset_var": self.offset_var,
            "state": self.state,
            "context": self.context,
            "last_block": self.last_block,
            "started": self.started,
            "closed_degraded": self.closed_degraded,
            "challengers": [
                {
                    "start": c.start,
                    "skip": c.skip,
                    "base": c.base,
                    "seed": c.seed,
                    "absorbed": c.absorbed,
                    "bases": [[s, v] for s, v in c.bases.items()],
                    "base_var": c.base_var,
                    "base_vars": [[s, v] for s, v in c.base_vars.items()],
                    "base_ess": c.base_ess,
                    "bases_ess": [[s, v] for s, v in c.bases_ess.items()],
                    "size": len(b),
                }
                for c, b in zip(self.challengers, blobs, strict=True)
            ],
        }
        head = json.dumps(header).encode()
        return len(head).to_bytes(8, "little") + head + b"".join(blobs)

    @classmethod
    def restore(
        cls,
        state: bytes,
        changepoints: bytes | None,
        settings: cp.ChangepointSettings | None,
        replay: Callable[[], Iterable[tuple[Any, Any]]],
    ) -> SegmentedEngine:
        """Rebuild from a checkpoint: ``state`` (the main engine's bytes), ``changepoints``
        (:meth:`changepoint_bytes`, or None/empty for a checkpoint written before this module) and
        ``replay()``, a fresh iterator over the stream's ``(x, y)`` chunks from its start.

        Raises
        ------
        ValueError
            Unknown format, or the stream log does not cover the checkpoint.
        """
        if not changepoints:
            return cls(ModelEngine.from_bytes(state, history_blocks=replay()), settings)
        n = int.from_bytes(changepoints[:8], "little")
        header = json.loads(changepoints[8 : 8 + n])
        if header["format"] != FORMAT:
            raise ValueError(f"change-point checkpoint format {header['format']} is not supported")
        main = ModelEngine.from_bytes(state, history_blocks=skip_observations(replay(), header["skipped"]))
        self = cls(main, settings)
        self.seed, self.skipped, self.offset = header["seed"], header["skipped"], header["offset"]
        self.state, self.context, self.last_block = header["state"], header["context"], header["last_block"]
        self.started = header.get("started", 0)
        self.closed_degraded = header.get("closed_degraded")
        self.offset_var = header.get("offset_var", 0.0)  # 0 (unknown) in checkpoints from before the error bars
        pos = 8 + n
        for c in header["challengers"]:
            blob = changepoints[pos : pos + c["size"]]
            pos += c["size"]
            eng = ModelEngine.from_bytes(blob, history_blocks=skip_observations(replay(), c["skip"]))
            bases = {int(s): float(v) for s, v in c["bases"]}
            base_vars = {int(s): float(v) for s, v in c.get("base_vars", [])}
            self.challengers.append(
                Challenger(
                    c["start"], c["skip"], c["base"], c["seed"], eng, c["absorbed"], bases, c.get("base_var", 0.0),
                    base_vars, c.get("base_ess", 1.0), {int(s): float(v) for s, v in c.get("bases_ess", [])},
                )
            )  # fmt: skip
        return self
