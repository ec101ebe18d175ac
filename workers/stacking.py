"""Advance many models by one block each with the stacked kernel; the engine's policies around it.

A model is ``(family, settings, generator, state)`` (:class:`workers.engine.ModelEngine` is one).
:func:`advance_stack` takes any number of them with a chunk each, splits the chunks into blocks,
and in each round groups the models whose next block can run in one kernel call — same
:func:`stack_key`, same particle count ``M`` and block length ``B`` — into a
:class:`workers.sgais.StackBlock`.  Around the kernel, per model and outside it (STYLE.md):

* the warm-up population (``warmup_particles`` until ``warmup_observations``, then
  :func:`reduce_particles`);
* the control variates' anchors (re-anchored when the history has grown by ``anchor_growth``);
* the Fisher step caps after the warm-up;
* change detection (``reanneal_steps``), ``change_burn_in`` and re-annealing (:func:`reanneal`).

Moving posteriors (issue 10, "trustworthy model comparison").  After the warm-up a block that needs at least
``change_threshold(MOVING_STEPS, D)`` annealing steps and is absorbed by the running population (no re-annealing
replaced it in the same block) leaves the model ``degraded`` until a re-annealing replaces its estimate.  Why: the
ESS-chosen increments satisfy ``Δ·sd(ℓ_C) ≈ const`` (thesis eq. 4.15), so the step count measures how far the
block moves the posterior in units of the particle cloud; on stationary data it is ``≈ √(D/2)·B/n`` times a
constant (:func:`change_threshold`: at most 6 steps after the warm-up in 16 stationary runs of gmm, linear
regression with known and unknown noise and AR(1), n = 10⁴, ``python bench/conflict.py stationary --seeds 4``).
Many steps mean a posterior that moves faster than ``burn_in`` SGHMC steps of size ``η ≈ lr/n`` carry the
particles.  AIS stays unbiased with moves that do not mix only when they leave each tempered target exactly
invariant (Neal 2001, "Annealed importance sampling", *Stat. Comput.* 11, §2); SGHMC's discretised, mini-batch
moves do not, and the error bar (:mod:`workers.sgais`, "Error bars") assumes perfect mixing.  Measured
(``python bench/conflict.py drift --seeds 10``, a one-component gmm whose data mean jumps by 3 sd): between
the re-annealings at n = 3,000 and 6,000 the blocks need 13–45 steps and the running estimate drifts to
−3.4 nats on average at n = 5,000 (−7.4 at worst) with a reported SE of about 1.1, status ``ok`` before this
rule; the score check (:mod:`workers.conflict`) does not see it: run against the exact posterior after each of
those 50 blocks it fails 4 of them, in 3 of the 10 seeds (the particles sit within a few posterior sd of the
posterior, the error is in the path), and no re-anchoring pass (where it would be free) falls between the
re-annealings, which reset the anchors.  The flag is cleared only by a re-annealing: the replay is a new
estimate from fresh draws in a random (stationary) order; a later block with few steps does not undo the drift
already in the running estimate.

Every random draw of a model comes from its own generator and the kernel's arithmetic is row-wise,
so a model's trace is the same bits alone or in any stack (``tests/workers/test_stack.py``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, overload

import torch

from models.base import Family
from models.stack import StackedFamily, stack_key_of
from workers import conflict, sgais
from workers.fisher import fisher_diagonal
from workers.gradients import history_gradient
from workers.history import History, StackBatches
from workers.resampling import RESAMPLERS, systematic_resample
from workers.settings import SamplerSettings
from workers.state import BlockInfo, BlockLikelihoods, Model, SGAISState, Slot, summaries

#: Sampler settings that may differ between the models of one stack (per-model rows or engine policy).
PER_MODEL_SETTINGS = frozenset(
    {
        "seed",
        "learning_rate",
        "momentum_decay",
        "ess_target",
        "resample_threshold",
        "burn_in",
        "catch_up_moves",
        "gibbs_sweeps",
        "change_burn_in",
        "reanneal_steps",
        "reanneal_growth",
        "reanneal_horizon",
        "restart_min_rows",
        "warmup_observations",
        "anchor_growth",
        "history_capacity",
        "fisher_step_growth",
    }
)


Result = list[BlockInfo] | sgais.NumericalError

#: ESS target of a block taken in one increment (0: solve_increment returns the whole remainder).
ONE_STEP_TARGET = 0.0

#: The variance slack ``s`` of the diagonal step ``η_d = lr·min(s·Var_d, 1/(n·f_d))`` (``workers.sgais._step_sizes``)
#: in the warm-up and after it.  SGHMC has no Metropolis correction: on a Gaussian target its stationary variance
#: exceeds the target's by a factor growing with ``η·h`` (1.125 at 0.4, 1.029 at 0.1 for α = 0.2: the linear
#: recursion's fixed point), and annealing through particles wider than each tempered target biases ``log Ẑ`` low.
#: In the warm-up the variance cap binds (the Fisher cap assumes unit curvature per observation until it is
#: measured), so a slack of 4 ran the early blocks at ``η·h`` ≈ 0.4: AR(1) on RunLog's first 10 values ended
#: −1.34 ± 0.15 nats from exact (20 seeds; reported SE 0.22), −0.30 ± 0.04 with 1; ``bench/ar_real_data.py
#: --seeds 2``: 6 of 26 runs `ok` and beyond 3 SE with 4, 1 with 1.  After the warm-up the measured Fisher cap
#: binds and the variance of 10 particles is noisy: a slack of 1 there let it shrink the steps, and linear
#: regression d = 5 ended −2.42 nats at n = 10⁵ (16 seeds) against −1.60 with 4 (bench/README.md, "Step-size bias
#: of a live feed's first blocks").
WARMUP_VARIANCE_SLACK = 1.0
VARIANCE_SLACK = 4.0

#: The model's status reason when a block hit ``max_annealing_steps`` (the rest taken in one increment).
GUARD_REASON = (
    "a block needed more than max_annealing_steps = {} annealing steps; the rest of its likelihood was "
    "taken in one increment, so the evidence is not certified"
)
#: The model's status reason when the particles of some annealing step still lagged its tempered target after
#: ``catch_up_moves`` extra rounds of moves (:func:`workers.sgais._catch_up`): the next increments were weighted at
#: particles off the target, so ``log Ẑ`` may be biased beyond its error bar, which assumes perfect mixing.
LAG_REASON = (
    "the particles still lagged the tempered target (Stein's identity, workers.sgais.lagging) after {} extra "
    "rounds of moves in {} of the block's {} annealing steps; the evidence is not certified (more burn_in or a "
    "larger learning_rate helps)"
)
#: The model's status reason once a reservoir (``history_capacity``) holds fewer rows than were seen: the
#: mini-batch gradients then follow a subsample and the evidence is biased beyond its Monte Carlo error
#: (measured, ``python bench/conflict.py reservoir``, n = 20,000, capacity 500: gmm −4.1 nats against +0.1
#: with the whole history; 5-feature regression −37.4 against −2.2).
RESERVOIR_REASON = (
    "the history reservoir (history_capacity = {}) holds a subsample of the {} observations seen; the evidence "
    "is biased (measured tens of nats at 40x the capacity, bench/conflict.py reservoir) and not certified"
)
Heartbeat = Callable[[], None] | None


def stack_key(model: Model) -> tuple[Any, ...]:
    """Models with equal keys can share a stack: family shapes, sampler settings that change shapes or
    control flow, dtype and device (:data:`PER_MODEL_SETTINGS` may differ).

    Kept on the model with the settings object it was computed from (a model's family is fixed; its settings are
    replaced, never changed: they are frozen), so a round groups its populations without reading each one's
    settings again."""
    got = model.__dict__.get("_stack_key")
    if got is not None and got[0] is model.settings:
        return got[1]
    key = (stack_key_of(model.family), *_settings_key(model.settings))
    model.__dict__["_stack_key"] = (model.settings, key)
    return key


#: The sampler settings a stack key holds (every field but :data:`PER_MODEL_SETTINGS`), in name order.
_KEY_FIELDS = tuple(sorted(f for f in SamplerSettings.model_fields if f not in PER_MODEL_SETTINGS))


def _settings_key(s: SamplerSettings) -> tuple[Any, ...]:
    """The part of :func:`stack_key` from the sampler settings: ``((name, value), …)`` of :data:`_KEY_FIELDS`, dtype
    and device.  Read field by field (every field is a scalar): each new challenger has settings of its own (its
    seed), and a ``model_dump`` of them cost tens of microseconds a challenger."""
    return (tuple((k, getattr(s, k)) for k in _KEY_FIELDS), str(s.torch_dtype), str(s.torch_device))


def init_state(generator: torch.Generator, family: Family, settings: SamplerSettings) -> SGAISState:
    """Prior draws ``θ_i ~ p(θ)``, ``log w_i = 0`` (Alg. 8, lines 1–2), an empty history.

    Raises NumericalError when a prior draw is not finite."""
    (state,) = init_states([(generator, family, settings)])
    if isinstance(state, Exception):
        raise state
    return state


def init_states(
    specs: Sequence[tuple[torch.Generator, Family, SamplerSettings]],
) -> list[SGAISState | sgais.NumericalError]:
    """:func:`init_state` of several models, ``(generator, family, sampler settings)`` each: the draws of each from its
    own generator, then the states of every group of one particle count, dimension, dtype and device built at once
    (:func:`workers.sgais.from_draws`, one batched summary), each the state it gets alone; a model whose draws are not
    finite gets a NumericalError instead.  A round's new challengers start this way (:mod:`workers.segmented`): one
    at a time, building a state cost a fresh challenger's prior draw three times over."""
    out: list[SGAISState | sgais.NumericalError | None] = [None] * len(specs)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, (_, family, s) in enumerate(specs):
        groups.setdefault((s.initial_particles, family.dim, s.torch_dtype, str(s.torch_device)), []).append(i)
    for (M, _, _, _), idx in groups.items():
        dtype, device = specs[idx[0]][2].torch_dtype, specs[idx[0]][2].torch_device
        theta = sgais.prior_draws([specs[i][0] for i in idx], [specs[i][1] for i in idx], M, dtype, device)
        finite = torch.isfinite(theta).flatten(1).all(1).tolist()
        good = [j for j, ok in enumerate(finite) if ok]
        for j in (j for j, ok in enumerate(finite) if not ok):
            out[idx[j]] = sgais.NumericalError(sgais.PRIOR_NOT_FINITE)
        if not good:
            continue
        st = sgais.from_draws(theta if len(good) == len(idx) else theta[good])
        log_ws, evs = list(st.log_w), list(st.evidence_var)  # each state's own views: its summary is keyed by them
        for r, (j, summary) in enumerate(zip(good, summaries(st.log_w, log_ws, st.evidence_var, evs), strict=True)):
            s = specs[idx[j]][2]
            history = History(capacity=s.history_capacity, seed=s.seed, dtype=dtype, device=device)
            out[idx[j]] = SGAISState(
                st.theta[r], log_ws[r], st.velocity[r], st.anchor[r], st.anchor_grad[r], 0, st.posterior_var[r],
                history, None, 0, evidence_var=evs[r], summary=summary,
            )  # fmt: skip
    assert all(v is not None for v in out)
    return out  # type: ignore[return-value]


def advance_stack(
    models: Sequence[Model],
    chunks: Sequence[tuple[Any, Any]],
    *,
    validated: bool = False,
    heartbeat: Heartbeat = None,
) -> list[Result]:
    """Absorb ``chunks[i] = (x, y)`` into ``models[i]``, all models advancing together.

    Each chunk is split into blocks of its model's ``block_size``; round ``r`` absorbs the ``r``-th
    block of every model that has one, in stacks of compatible models.  The result of model ``i``
    is its list of :class:`BlockInfo` (identical to what the model gets alone), or the
    :class:`~workers.sgais.NumericalError` that stopped it (its earlier blocks stay absorbed; the
    failing block is not).  ``heartbeat`` is called between the blocks of a re-annealing (a long
    one takes as long as the history took); if it raises, that model's block is not absorbed and
    the exception propagates.

    Raises
    ------
    models.ObservationError
        A chunk is invalid (unless ``validated``); nothing is absorbed.
    """
    data = [(x, y) if validated else m.family.validate(x, y) for m, (x, y) in zip(models, chunks, strict=True)]
    results: list[Result] = [[] for _ in models]
    rounds = max((-(-y.shape[0] // m.settings.block_size) for m, (_, y) in zip(models, data, strict=True)), default=0)
    for r in range(rounds):
        todo = []
        for i, (m, (x, y)) in enumerate(zip(models, data, strict=True)):
            a, b = r * m.settings.block_size, (r + 1) * m.settings.block_size
            if a < y.shape[0] and isinstance(results[i], list):
                todo.append((i, rows_between(x, a, b), rows_between(y, a, b)))
        infos = _advance_round([models[i] for i, _, _ in todo], [(x, y) for _, x, y in todo], heartbeat)
        for (i, _, _), info in zip(todo, infos, strict=True):
            res = results[i]
            if isinstance(info, BlockInfo) and isinstance(res, list):
                res.append(info)
            elif isinstance(info, sgais.NumericalError):
                results[i] = info
    return results


@overload
def rows_between(t: torch.Tensor, a: int, b: int | None) -> torch.Tensor: ...
@overload
def rows_between(t: None, a: int, b: int | None) -> None: ...
def rows_between(t: torch.Tensor | None, a: int, b: int | None) -> torch.Tensor | None:
    """``t[a:b]`` (None for None), ``t`` itself when that is every row: a chunk that is one block, the usual case,
    is not sliced again for every model of a round (a slice is a few microseconds of Python indexing)."""
    if t is None or (a == 0 and (b is None or b >= t.shape[0])):
        return t
    return t[a:b]


#: The order of :class:`workers.sgais.StackState`'s fields, which :func:`_run_stack` unpacks per model.
_STACK_FIELDS = ("theta", "log_w", "velocity", "anchor", "anchor_grad", "posterior_var", "evidence_var")
assert sgais.StackState._fields == _STACK_FIELDS
#: The order of :class:`workers.state.SGAISState`'s fields, which :func:`_run_stack` builds positionally.
assert SGAISState._fields == (
    "theta", "log_w", "velocity", "anchor", "anchor_grad", "n_anchor", "posterior_var", "history", "context", "blocks",
    "n_reanneal", "n_change", "evidence_var", "degraded", "summary",
)  # fmt: skip


class _Pending(NamedTuple):
    slot: int
    model: Model
    state: SGAISState  # after the pre-block policies
    x: torch.Tensor | None
    y: torch.Tensor
    context: torch.Tensor | None
    burn_in: int
    fisher: bool
    anchored: bool
    variance_slack: float
    raw: int = 0  # stream values in the block (rows plus values taken into the context)
    one_step: bool = False  # a defensive start (workers.conflict): the block's likelihood in one increment
    catch_up: int = 0  # extra rounds of moves while the particles lag (workers.sgais._catch_up); 0 after the warm-up
    gibbs_sweeps: int = 0  # Gibbs sweeps per annealing step instead of SGHMC moves (workers.sgais.gibbs_sweep)


def _advance_round(models: Sequence[Model], blocks: Sequence[tuple[Any, Any]], heartbeat: Heartbeat) -> list[Any]:
    """One block per model (raw stream values): prepare, group into stacks, run, apply the policies."""
    out: list[Any] = [None] * len(models)
    pending: list[_Pending] = []
    prepared: list[tuple[int, Model, SGAISState, torch.Tensor | None, torch.Tensor, torch.Tensor | None, int]] = []
    for i, (m, (x, y)) in enumerate(zip(models, blocks, strict=True)):
        s, st = m.settings, m.state
        assert st is not None
        dtype, device = s.torch_dtype, s.torch_device
        x = x.to(dtype=dtype, device=device) if x is not None else None
        xr, yr, context = m.family.prepare(x, y.to(dtype=dtype, device=device), st.context)
        if yr.shape[0] == 0:  # every value went into the conditioning context
            _take_context(m, st, context, y.shape[0])
            out[i] = BlockInfo(0, 0.0, st.log_evidence, 0, st.ess, False, False,
                               log_evidence_se=st.log_evidence_se)  # fmt: skip
            continue
        prepared.append((i, m, st, xr, yr, context, y.shape[0]))
    restarting: dict[int, _Restart] = {}  # slot (len(models) + i) -> a restart's fresh population and its model
    for i, m, st, xr, yr, context, raw in prepared:
        if restarts(m, st, yr):
            try:
                restarting[len(models) + i] = _restart_begin(i, m, st, xr, yr, context, raw)
            except sgais.NumericalError as err:
                out[i] = err
    # the round's first blocks, the restarts' fresh populations among them, take their conflict tests together
    firsts = prepared + [(k, r.fresh, r.fresh.state, r.x_all, r.y_all, None, 0) for k, r in restarting.items()]
    cleared = _cleared(firsts)
    for i, m, st, xr, yr, context, raw in prepared:
        if len(models) + i not in restarting and out[i] is None:
            pending.append(_before_block(i, m, st, xr, yr, context, cleared=cleared.get(i), raw=raw))
    for k, r in restarting.items():  # the fresh populations absorb history and block as a first block, stacked
        assert r.fresh.state is not None
        pending.append(_before_block(k, r.fresh, r.fresh.state, r.x_all, r.y_all, None, cleared=cleared.get(k)))
    groups: dict[tuple[Any, ...], list[_Pending]] = {}
    for p in pending:
        key = (stack_key(p.model), p.state.theta.shape[0], tuple(p.y.shape), p.x is None)
        groups.setdefault(key, []).append(p)
    for group in groups.values():
        for p, info in zip(group, _run_stack(group, heartbeat), strict=True):
            if p.slot in restarting:
                r = restarting[p.slot]
                out[r.slot] = _restart_end(r, info)
            else:
                out[p.slot] = info
    return out


def restarts(m: Model, st: SGAISState, y: torch.Tensor) -> bool:
    """Whether a block of rows ``y`` is absorbed by a restart (:func:`_restart_begin`): it holds at least
    ``restart_min_rows`` rows and at least as many as the population's whole, held history (``0 < n_prev ≤ rows``).
    Each restart at least doubles the history, so the rows replayed stay below twice the stream's: O(1) per
    observation, like the re-anchoring.  The minimum keeps a live feed's small blocks incremental (a restart from the
    prior takes more annealing steps than the block it replaces: a one-component gmm fed 5 values a chunk took 45%
    more engine time over its first 100 values with restarts from 1 row); in the change-point ramp of a stream's first
    values (sub-blocks of 1, 2, 4, … values) the restart at the largest sub-block replays the smaller ones too."""
    n_prev, rows, least = st.history.seen, int(y.shape[0]), m.settings.restart_min_rows
    return least is not None and rows >= least and 0 < n_prev <= rows and st.history.size == n_prev


class _Restart(NamedTuple):
    """A block absorbed by a restart (:func:`_restart_begin`): the model, its state before the block, the block's rows
    and the fresh population that absorbs the history and the block (``x_all``, ``y_all``) in the round's stacks."""

    slot: int
    model: Model
    state: SGAISState
    x: torch.Tensor | None
    y: torch.Tensor
    context: torch.Tensor | None
    raw: int
    x_all: torch.Tensor | None
    y_all: torch.Tensor
    fresh: Slot
    rows: torch.Tensor  # log p(y_b | θ_m) at the running particles: [M, R]
    log_predictive: float


def _restart_begin(
    slot: int,
    m: Model,
    st: SGAISState,
    x: torch.Tensor | None,
    y: torch.Tensor,
    context: torch.Tensor | None,
    raw: int,
) -> _Restart:
    """Start absorbing a block of at least ``restart_min_rows`` rows and as large as the history (:func:`restarts`)
    by a fresh run from the prior over the history and the block in one block (the first block's path: a defensive
    Laplace start where the rows conflict with the prior draws, else annealing with exact gradients), which replaces
    the population and its evidence, as :func:`reanneal`'s replay does (its own error bar, its own checks).  The
    fresh populations of a round's restarts absorb their rows in the round's stacks (:func:`_advance_round`; each gets
    the bits it gets alone), and :func:`_restart_end` installs the result.

    Why: such a block moves the posterior by more than a factor √2 in scale, and the SGHMC moves lag a posterior
    that contracts that fast from a handful of rows; the error bar does not see the lag.  Measured (session 31, the
    demo's AR(2) on Occupancy, its first 50 values in the change-point ramp's sub-blocks of 1, 2, 4, …, 8 seeds):
    −1.39 ± 0.51 nats from the exact evidence with a reported standard error of 0.44, against −0.15 ± 0.17 (SE 0.20)
    with a restart at the 16-row sub-block, which replays the smaller ones.  The replay uses only fresh randomness
    (the model's generator), so ``E[Ẑ] = Z`` whatever the running population did (thesis eq. 4.6 for the replay
    alone).

    The block's ``log_predictive`` is the running population's one-step importance estimate of its rows
    (``logsumexp_m(log w̄_m + Σ_b log p(y_b | θ_m))``, thesis eq. 4.6 with one increment); the rest of the step from
    the old ``log Ẑ`` to the replay's is its ``log_evidence_correction``.

    Raises NumericalError when the fresh prior draws are not finite.
    """
    s = m.settings
    hx, hy = st.history.all_rows()
    x_all = torch.cat([hx, x]) if x is not None and hx is not None else None
    one = StackedFamily.of(m.family, s.torch_dtype, s.torch_device)
    with torch.no_grad():
        rows = one.log_likelihood(st.theta[None], x[None] if x is not None else None, y[None])[0]  # [M, R]
        log_predictive = float(torch.logsumexp(normalised(st.log_w) + rows.sum(-1), 0))
    fresh_settings = s.model_copy(update={"reanneal_steps": None})  # the replay does not re-anneal itself
    fresh = Slot(m.family, fresh_settings, m.generator, init_state(m.generator, m.family, fresh_settings))
    return _Restart(slot, m, st, x, y, context, raw, x_all, torch.cat([hy, y]), fresh, rows, log_predictive)


def _restart_end(r: _Restart, info: BlockInfo | sgais.NumericalError) -> BlockInfo | sgais.NumericalError:
    """Install a restart's fresh population (``info``: its block's result) as the model's, with the model's own
    history grown in place by the block, as after any block; the block's :class:`BlockInfo`."""
    if isinstance(info, sgais.NumericalError):
        return info
    m, st, new = r.model, r.state, r.fresh.state
    assert new is not None
    st.history.append(r.x, r.y)
    m.state = new._replace(
        history=st.history, context=r.context, blocks=st.blocks + 1, n_reanneal=st.n_reanneal, n_change=st.n_change
    )
    m.observations += r.raw
    m.block_likelihoods = BlockLikelihoods(st.theta, r.rows)
    log_z = m.state.log_evidence
    return BlockInfo(
        observations=int(r.y.shape[0]),
        log_predictive=r.log_predictive,
        log_evidence=log_z,
        annealing_steps=info.annealing_steps,
        ess=m.state.ess,
        resampled=info.resampled,
        guard_tripped=info.guard_tripped,
        reannealed=True,  # the population and its evidence were replaced by a replay from the prior (API: reannealed)
        log_evidence_se=m.state.log_evidence_se,
        log_evidence_correction=log_z - st.log_evidence - r.log_predictive,
        degraded=m.state.degraded,
    )


def normalised(log_w: torch.Tensor) -> torch.Tensor:
    """``log w̄ = log w − logsumexp(log w)`` along the last axis (``log_w: [..., M]``): normalised log-weights."""
    return log_w - torch.logsumexp(log_w, -1, keepdim=True)


def _take_context(m: Model, st: SGAISState, context: torch.Tensor | None, values: int) -> None:
    """A block whose ``values`` all went into the conditioning ``context`` (no likelihood rows): the state keeps
    them and counts the block."""
    m.state = st._replace(context=context, blocks=st.blocks + 1)
    m.observations += values


def absorb_context(m: Model, x: torch.Tensor | None, y: torch.Tensor) -> None:
    """What :func:`advance_stack` does with a block of validated values that all go into ``m``'s conditioning
    context (an autoregressive model's first ``order`` values), without the stacking round: a challenger started
    after the stream's first values takes the values before its start this way (:mod:`workers.segmented`).

    Raises ValueError when some of the values would be likelihood rows."""
    st, s = m.state, m.settings
    assert st is not None
    x = x.to(dtype=s.torch_dtype, device=s.torch_device) if x is not None else None
    _, yr, context = m.family.prepare(x, y.to(dtype=s.torch_dtype, device=s.torch_device), st.context)
    if yr.shape[0]:
        raise ValueError(f"{yr.shape[0]} of the {y.shape[0]} values are likelihood rows, not context")
    _take_context(m, st, context, y.shape[0])


def _first_block(st: SGAISState) -> bool:
    """The prior population meets its first likelihood rows (a new model, a new challenger)."""
    return st.history.seen == 0 and st.n_anchor == 0 and bool((st.log_w == 0).all())


def _cleared(prepared: list[tuple[Any, ...]]) -> dict[int, bool]:
    """Slot -> :func:`workers.conflict.clear_of_conflict` for the round's populations at their first block,
    one stacked evaluation per group of one stack key and shape (a round on a new stream starts a population per
    model; challengers start every few blocks)."""
    groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for p in prepared:
        i, m, st, x, y = p[:5]
        if _first_block(st):
            key = (stack_key(m), tuple(st.theta.shape), tuple(y.shape), x is None)
            groups.setdefault(key, []).append(p)
    out: dict[int, bool] = {}
    for group in groups.values():
        m0 = group[0][1]
        device = m0.settings.torch_device
        family = StackedFamily([p[1].family for p in group], torch.float64, device)
        x = torch.stack([p[3].to(torch.float64) for p in group]) if group[0][3] is not None else None
        y = torch.stack([p[4].to(torch.float64) for p in group])
        theta = torch.stack([p[2].theta for p in group])
        out.update(zip((p[0] for p in group), conflict.clear_of_conflict(family, theta, x, y), strict=True))
    return out


def _before_block(
    i: int,
    m: Model,
    st: SGAISState,
    x: torch.Tensor | None,
    y: torch.Tensor,
    context: torch.Tensor | None,
    *,
    cleared: bool | None = None,
    raw: int = 0,
) -> _Pending:
    """Warm-up reduction, re-anchoring, the block's burn-in and whether the Fisher caps apply.  ``cleared``:
    the first block's conflict test when the round already ran it (:func:`_cleared`), None when not; ``raw``: the
    block's stream values (:attr:`_Pending.raw`)."""
    s, history = m.settings, st.history
    n_prev = history.seen
    one_step = False
    if not cleared and _first_block(st):
        # the prior population meets its first likelihood rows: a defensive Laplace start when they conflict
        start = conflict.defensive_start(m.generator, m.family, st.theta, x, y, tested=cleared is not None)
        if start is not None:  # importance sampling of the block: its likelihood in one increment (below)
            # posterior_var: the Laplace variances (the step sizes' floor is a quarter of the last value)
            st = st._replace(theta=start[0], log_w=start[1], posterior_var=start[2])
            one_step = True
    if st.theta.shape[0] > s.particles and n_prev >= s.warmup_observations:
        st = reduce_particles(m.generator, st, s.particles)
    # a sufficient-statistics or weighted-gradient family takes its exact history gradient while the history fits in
    # one mini-batch (workers.sgais._whole_history, _whole_rows): anchors would go unused, so the first anchoring waits
    # until it outgrows it
    exact = m.family.sufficient_statistics or m.family.weighted_gradients
    whole = exact and history.size == n_prev <= s.batch_size and st.n_anchor == 0
    anchored = s.control_variates and history.size > 0 and not whole
    if anchored and (st.n_anchor == 0 or n_prev >= s.anchor_growth * st.n_anchor):
        # Re-anchor every particle at its current position: one pass over H, amortised O(1)
        # per observation because it happens each time the history grows by anchor_growth.
        hx, hy = history.all_rows()
        one = StackedFamily.of(m.family, s.torch_dtype, s.torch_device)
        g = history_gradient(one, st.theta[None], hx[None] if hx is not None else None, hy[None])[0]
        st = st._replace(anchor=st.theta.clone(), anchor_grad=g * (n_prev / history.size), n_anchor=n_prev)
    burn_in = s.burn_in
    n = n_prev + y.shape[0]
    if s.change_burn_in is not None and st.n_change and n <= s.reanneal_horizon * st.n_change:
        burn_in = max(burn_in, s.change_burn_in)  # the posterior is still moving after a change
    elif s.change_burn_in is not None and n_prev < s.warmup_observations:
        burn_in = max(burn_in, min(s.change_burn_in, warmup_burn_in(burn_in, st.theta.shape[-1])))
    fisher = s.preconditioning and s.fisher_step_growth > 1 and n_prev >= s.warmup_observations
    warmup = n_prev < s.warmup_observations
    slack = WARMUP_VARIANCE_SLACK if warmup else VARIANCE_SLACK
    # the lag check's exact score is a pass over the whole history: in the warm-up, like the score check; a model
    # already degraded (e.g. moves that do not mix at their step size: every round would be spent) takes none, nor
    # a mixture (its particles spread over the label modes: the moves do not carry them between modes)
    mixture = m.family.exchangeable_parameters()
    catch_up = s.catch_up_moves if warmup and history.size == n_prev and st.degraded is None and not mixture else 0
    # the exact conditionals read the whole history's statistics (cached per block): in the warm-up, with every row held
    moves = m.family.gibbs_conditionals or m.family.exact_draws
    gibbs = s.gibbs_sweeps if moves and warmup and history.size == n_prev else 0
    return _Pending(
        i, m, st, x, y, context, burn_in, fisher, anchored, slack, raw=raw, one_step=one_step, catch_up=catch_up,
        gibbs_sweeps=gibbs,
    )  # fmt: skip


@functools.cache  # a few settings and dimensions; called for every population every block
def warmup_burn_in(burn_in: int, dim: int) -> int:
    """SGHMC steps per annealing step in the warm-up for ``dim`` parameters: ``ceil(burn_in·√(dim/4))``
    (the caller keeps at least ``burn_in`` and at most ``change_burn_in``).

    In the warm-up the posterior contracts from the prior block after block, and the diagonally preconditioned
    moves lag it more the more parameters it has; the error bar, which assumes perfect mixing, does not see the
    lag.  Measured, signed error mean ± sd over 16 seeds:

    * logistic regression, 44 parameters, n = 10³ (``python bench/logistic_sweep.py --n 1000 --seeds 16``):
      −1.04 ± 0.47 nats with 20 steps (beyond 2 reported SE in 7 of 16 seeds), −0.41 ± 0.35 with 60 (2 of 16);
    * linear regression, 6 parameters (``python bench/accuracy.py --n 10000 --seeds 16``): at n = 10³ / 10⁴
      −0.65 / −1.58 with 20 steps, −0.53 / −1.01 with 25 (this rule), −0.45 / −0.82 with 60;
    * a one-component gmm (2 parameters) keeps 20: 60 steps nearly doubled a live 5-observation block
      (``python bench/many_models.py --part gmm``: 13.9 → 24.5 ms) without moving its error.

    The ``√dim`` is :func:`change_threshold`'s scaling of the ESS-chosen step count: a heuristic, not a
    mixing-time bound."""
    return math.ceil(burn_in * math.sqrt(dim / REANNEAL_REFERENCE_DIM))


def _run_stack(group: list[_Pending], heartbeat: Heartbeat) -> list[BlockInfo | sgais.NumericalError]:
    """Stack the group's states, run :func:`workers.sgais.absorb_block`, apply the after-block policies."""
    s0 = group[0].model.settings
    dtype, device = s0.torch_dtype, s0.torch_device
    models = [p.model for p in group]
    family = StackedFamily([m.family for m in models], dtype, device)
    gens = [m.generator for m in models]
    states = [p.state for p in group]
    state = sgais.StackState(
        *(torch.stack([getattr(st, f) for st in states]) for f in sgais.StackState._fields)
    )  # fmt: skip
    xs = [p.x for p in group if p.x is not None]
    x = torch.stack(xs) if xs else None
    y = torch.stack([p.y for p in group])
    f64: dict[str, Any] = {"dtype": torch.float64, "device": device}
    histories = [st.history for st in states]
    fisher = torch.ones(state.posterior_var.shape, **f64)
    need = [k for k, p in enumerate(group) if p.fisher]
    if need:
        idx = torch.tensor(need, device=device)
        f = fisher_diagonal([gens[k] for k in need], family.select(idx), state.theta[idx], state.log_w[idx],
                            x[idx] if x is not None else None, y[idx])  # fmt: skip
        floor = torch.tensor([1.0 / models[k].settings.fisher_step_growth for k in need], **f64)
        fisher[idx] = torch.maximum(f, floor[:, None])

    def per_model(field: str) -> torch.Tensor:
        return torch.tensor([float(getattr(m.settings, field)) for m in models], **f64)

    settings = sgais.KernelSettings(
        learning_rate=per_model("learning_rate"),
        momentum_decay=per_model("momentum_decay"),
        # a defensive start takes its block in one increment (importance sampling, workers.conflict): any
        # positive target below CESS(1) does that
        ess_target=torch.where(
            torch.tensor([p.one_step for p in group], device=device), ONE_STEP_TARGET, per_model("ess_target")
        ),  # fmt: skip
        resample_threshold=per_model("resample_threshold"),
        burn_in=torch.tensor([p.burn_in for p in group], device=device),
        variance_slack=torch.tensor([p.variance_slack for p in group], **f64),
        catch_up=torch.tensor([p.catch_up for p in group], device=device),
        gibbs_sweeps=torch.tensor([p.gibbs_sweeps for p in group], device=device),
        max_annealing_steps=s0.max_annealing_steps,
        move_every_step=s0.moves == "every_step",
        annealed_schedule=s0.learning_rate_schedule == "annealed",
        preconditioning=s0.preconditioning,
        control_variates=s0.control_variates,
        resampler=RESAMPLERS[s0.resampling],
    )
    block = sgais.StackBlock(
        generators=gens,
        models=list(range(len(group))),
        family=family,
        x=x,
        y=y,
        n_prev=torch.tensor([float(h.seen) for h in histories], **f64),
        batches=StackBatches(histories, s0.batch_size) if any(h.size for h in histories) else None,
        fisher=fisher,
        settings=settings,
    )
    new, stats = sgais.absorb_block(block, state)
    if stats.first_rows is not None:  # the block's rows at the particles before it (workers.segmented._locate)
        for p, rows in zip(group, stats.first_rows, strict=True):
            p.model.block_likelihoods = BlockLikelihoods(p.state.theta, rows)
    # Keep G_i = Σ_{y∈H} ∇ log p(y|a_i) exact as the block joins the history.
    anchored = torch.tensor([p.anchored for p in group], device=device)
    if anchored.any():
        g = family.grad_log_likelihood(new.anchor, x, y)
        new = new._replace(anchor_grad=torch.where(anchored[:, None, None], new.anchor_grad + g, new.anchor_grad))
    out: list[BlockInfo | sgais.NumericalError | None] = [None] * len(group)
    olds = _summarised([p.state for p in group], state.log_w)  # log Ẑ before the block: the missing ones at once
    # (k, state after the policies, log Ẑ before the block, its log-predictive, log Ẑ after the policies, reannealed)
    done: list[tuple[int, SGAISState, float, float, float, bool]] = []
    # each field's per-model views (iterating a tensor makes them cheaper than unbind(0) or K indexing calls); a field
    # the kernel returned unchanged (the same tensor: the velocities and anchors of a block moved by exact draws) keeps
    # each model's own tensor, as stacked
    rows = [  # StackState's fields in order (_STACK_FIELDS)
        [getattr(st, f) for st in states] if t is t0 else list(t)
        for f, t, t0 in zip(_STACK_FIELDS, new, state, strict=True)
    ]
    log_ws, evidence_vars = rows[_STACK_FIELDS.index("log_w")], rows[_STACK_FIELDS.index("evidence_var")]
    sums = summaries(new.log_w, log_ws, new.evidence_var, evidence_vars)  # for the whole stack at once
    for k, (p, (theta, log_w, velocity, anchor, anchor_grad, posterior_var, evidence_var)) in enumerate(
        zip(group, zip(*rows, strict=True), strict=True)
    ):
        if stats.error[k] is not None:
            out[k] = sgais.NumericalError(stats.error[k])
            continue
        old = olds[k]
        st = SGAISState(  # old._replace(...) of these fields, built directly (namedtuple's _replace costs microseconds)
            theta, log_w, velocity, anchor, anchor_grad, old.n_anchor, posterior_var, old.history, p.context,
            old.blocks + 1, old.n_reanneal, old.n_change, evidence_var, old.degraded, sums[k],
        )  # fmt: skip
        if stats.guard_tripped[k] and st.degraded is None:
            st = st._replace(degraded=GUARD_REASON.format(s0.max_annealing_steps))
        if stats.behind[k] and st.degraded is None:
            st = st._replace(degraded=LAG_REASON.format(p.catch_up, stats.behind[k], stats.annealing_steps[k]))
        old_log_z, log_z = old.log_evidence, st.log_evidence
        log_predictive = log_z - old_log_z
        try:
            st, reannealed = _after_block(p.model, st, p.x, p.y, steps=stats.annealing_steps[k], heartbeat=heartbeat)
        except sgais.NumericalError as err:
            out[k] = err
            continue
        if reannealed:  # the replay replaced the population (and its evidence)
            log_z = st.log_evidence
        done.append((k, st, old_log_z, log_predictive, log_z, reannealed))
    # the history grew in place by the block's likelihood rows (History.append)
    due = [(k, st) for k, st, *_ in done if _needs_score_check(models[k], st, st.history.seen - group[k].y.shape[0])]
    checked = _score_checks(family, due)
    for k, st, old_log_z, log_predictive, log_z, reannealed in done:
        p = group[k]
        if k in checked:
            st = st._replace(degraded=checked[k])
        p.model.state = st
        p.model.observations += p.raw
        out[k] = BlockInfo(
            observations=p.y.shape[0],
            log_predictive=log_predictive,
            log_evidence=log_z,
            annealing_steps=stats.annealing_steps[k],
            ess=st.ess,
            resampled=stats.resampled[k],
            guard_tripped=stats.guard_tripped[k],
            reannealed=reannealed,
            log_evidence_se=st.log_evidence_se,
            log_evidence_correction=log_z - old_log_z - log_predictive,
            degraded=st.degraded,
        )
    results = [o for o in out if o is not None]
    assert len(results) == len(group)  # every model has its BlockInfo or its error
    return results


def _after_block(
    m: Model, st: SGAISState, x: torch.Tensor | None, y: torch.Tensor, *, steps: int, heartbeat: Heartbeat
) -> tuple[SGAISState, bool]:
    """Append the block to the history; mark a change and re-anneal when the policy says so.

    A change: a block after the warm-up (early blocks need many steps as the posterior contracts
    from the prior) that needed ``reanneal_steps`` annealing steps, scaled with the dimension
    (:func:`change_threshold`).  Re-anneal then and at each
    ``reanneal_growth`` of the history while it is within ``reanneal_horizon`` of its size at the change.
    """
    s, history = m.settings, st.history
    n_prev = history.seen
    history.append(x, y)
    n = history.seen
    if (
        s.reanneal_steps is not None
        and steps >= change_threshold(s.reanneal_steps, st.theta.shape[-1])
        and n_prev >= max(s.warmup_observations, 1)
    ):
        st = st._replace(n_change=n)
    n_change = st.n_change
    reannealed = (
        n_change > 0
        and n <= s.reanneal_horizon * n_change
        and n >= s.reanneal_growth * st.n_reanneal
        and history.size == history.seen  # the whole history is held (no reservoir)
    )
    if reannealed:
        try:
            st = reanneal(m, st, heartbeat=heartbeat)
        except BaseException:
            history.truncate(n_prev)  # leave the input state as it was (the block is not absorbed)
            raise
    elif st.degraded is None and n_prev >= max(s.warmup_observations, 1):
        limit = change_threshold(MOVING_STEPS, st.theta.shape[-1])
        if steps >= limit:  # the running population lagged a moving posterior: not certified until a replay
            st = st._replace(degraded=MOVING_REASON.format(n, steps, limit, _next_replay(s, st, n)))
    if st.degraded is None and history.size < n:
        st = st._replace(degraded=RESERVOIR_REASON.format(s.history_capacity, n))
    return st, reannealed


#: Annealing steps of a block after the warm-up (scaled by :func:`change_threshold`) from which the running
#: log-evidence is not certified (module docstring, "Moving posteriors"); the default ``reanneal_steps``, fixed
#: here so that a user's ``reanneal_steps`` (a replay policy, 1 = replay at every growth step) does not move it.
MOVING_STEPS = 12
#: The model's status reason after such a block (the running estimate absorbed it; no re-annealing replaced it).
MOVING_REASON = (
    "the block to n = {} needed {} annealing steps (limit {:.3g}): the posterior moves faster than the SGHMC moves "
    "follow it and the running log-evidence drifts beyond its error bar (measured down to -7.4 nats with a "
    "1.1-nat error bar, bench/conflict.py drift); not certified until a re-annealing replaces it ({})"
)


def _next_replay(s: SamplerSettings, st: SGAISState, n: int) -> str:
    """Where the re-annealing that would clear :data:`MOVING_REASON` happens, for its text."""
    at = max(math.ceil(s.reanneal_growth * st.n_reanneal), n + 1)
    if s.reanneal_steps is None or st.history.size < st.history.seen or at > s.reanneal_horizon * st.n_change:
        return "none scheduled"
    return f"next at n >= {at}"


#: Parameter dimension up to which ``reanneal_steps`` applies as set (the models it was measured on: D ≤ 4).
REANNEAL_REFERENCE_DIM = 4


@functools.cache  # a few settings and dimensions; called for every population every block
def change_threshold(reanneal_steps: int, dim: int) -> float:
    """Annealing steps of a block that mark a change for a model with ``dim`` unconstrained parameters:
    ``reanneal_steps · max(1, √(dim / REANNEAL_REFERENCE_DIM))``.

    The ESS-chosen increments satisfy ``Δ · sd_π(ℓ_C) ≈ const`` (eq. 4.15 for small increments), so a
    block needs about ``sd_π(ℓ_C)`` steps; on stationary data the block's log-likelihood fluctuates over
    the posterior like a log-likelihood ratio, ``sd ≈ √(D/2) · B/n`` (its ``χ²_D/2`` limit), i.e. ∝ √D.
    Measured (``python bench/conflict.py trigger --seeds 2``): stationary linear regression, blocks of 500
    after the 2000-observation warm-up, D = 4: 2–3 steps; D = 61: 7–12 (12 on seed 1) — the unscaled
    threshold 12 fired on stationary data; scaled it is 46.9.
    """
    return reanneal_steps * max(1.0, math.sqrt(dim / REANNEAL_REFERENCE_DIM))


def _summarised(states: list[SGAISState], log_w: torch.Tensor) -> list[SGAISState]:
    """``states`` with their :attr:`SGAISState.summary` set: those without a current one (a new population, a
    defensive start, a reduced warm-up population) computed in one :func:`summaries` call over their rows of the
    stacked ``log_w: [K, M]`` (the same values; row-wise, so the same bits as each alone)."""
    stale = [
        k
        for k, st in enumerate(states)
        if st.summary is None or st.summary[0] is not st.log_w or st.summary[1] is not st.evidence_var
    ]
    if not stale:
        return states
    out = list(states)
    idx = torch.tensor(stale, device=log_w.device)
    closed = [states[k].evidence_var for k in stale]
    for k, summary in zip(
        stale, summaries(log_w[idx], [states[k].log_w for k in stale], torch.stack(closed), closed), strict=True
    ):
        out[k] = states[k]._replace(summary=summary)
    return out


def _needs_score_check(m: Model, st: SGAISState, n_prev: int) -> bool:
    """Whether the block just absorbed (the history grew from ``n_prev`` to ``n`` rows) is score-checked, when the
    whole history is held and the model not already ``degraded``: every block while the history is small (the
    warm-up, where prior–data conflict bites and the exact score costs no more than one re-anchoring pass), and
    after it each time the history doubles (``n`` passes ``W·2^j``, ``W`` the warm-up's end): one pass over the
    history per doubling, amortised O(1) per observation like the re-anchoring, so moves that drift off the
    posterior later in a stream (e.g. ``control_variates`` off: the mini-batch noise carried linear regression's
    particles six posterior sds away by n = 10⁵, −79 nats with status ``ok`` before this) are caught within a
    doubling."""
    n, s = st.history.seen, m.settings
    if st.degraded is not None or st.history.size != n:
        return False
    if m.family.exact_draws and s.gibbs_sweeps and n_prev < s.warmup_observations:
        return False  # the warm-up moved it by exact draws from each tempered target: nothing to lag
    first = max(s.warmup_observations, s.block_size, 1)
    if n <= first:
        return True
    top = first << ((n // first).bit_length() - 1)  # the largest W·2^j ≤ n
    return n_prev < top


def _score_checks(family: StackedFamily, todo: list[tuple[int, SGAISState]]) -> dict[int, str | None]:
    """:func:`workers.conflict.score_check` of each ``(k, state)`` (``k``: the model's row of ``family``)
    against the posterior of its whole history (exact score: prior + every held row), ``{k: reason or None}``.

    Models whose histories hold the same number of rows share one stacked gradient call, and every model of
    the stack one check (row-wise arithmetic: the same bits as one model alone)."""
    if not todo:
        return {}
    by_size: dict[int, list[tuple[int, SGAISState]]] = {}
    for k, st in todo:
        by_size.setdefault(st.history.size, []).append((k, st))
    ks, thetas, log_ws, scores = [], [], [], []
    for same in by_size.values():
        rows = [st.history.all_rows() for _, st in same]
        theta = torch.stack([st.theta for _, st in same])
        xs = [x for x, _ in rows if x is not None]
        hx = torch.stack(xs) if xs else None  # one family: every model has covariates or none does
        hy = torch.stack([y for _, y in rows])
        sub = family.select(torch.tensor([k for k, _ in same], device=theta.device))
        ks += [k for k, _ in same]
        thetas.append(theta)
        log_ws.append(torch.stack([st.log_w for _, st in same]))
        scores.append(sub.grad_log_prior(theta) + history_gradient(sub, theta, hx, hy))
    reasons = conflict.score_checks(torch.cat(thetas), torch.cat(log_ws), torch.cat(scores))
    return dict(zip(ks, reasons, strict=True))


def reduce_particles(generator: torch.Generator, state: SGAISState, M: int) -> SGAISState:
    """Resample the warm-up population down to ``M`` particles (end of warm-up).

    ``M`` ancestors are drawn systematically from the weighted particles and every new log-weight
    is the log of the old mean weight, so ``Ẑ = mean(w)`` is unchanged and stays unbiased (the
    same argument as resampling, thesis §3.4).  The warm-up epoch closes: its
    :func:`~workers.sgais.epoch_variance` joins ``evidence_var``.
    """
    log_w = state.log_w
    idx = systematic_resample(generator, log_w, M)
    log_mean = torch.logsumexp(log_w, 0) - math.log(log_w.shape[0])
    return state._replace(
        theta=state.theta[idx],
        velocity=state.velocity[idx],
        anchor=state.anchor[idx],
        anchor_grad=state.anchor_grad[idx],
        log_w=log_mean.expand(M).clone(),
        evidence_var=state.evidence_var + sgais.epoch_variance(log_w),
    )


def reanneal(m: Model, state: SGAISState, *, heartbeat: Heartbeat = None) -> SGAISState:
    """Run SGAIS afresh from the prior over the whole history in a random order and let it replace the
    running population and its evidence: the remedy for particles left in stale modes after a change point.

    After a change the posterior moves far within one block (many annealing steps) and local SGHMC
    moves rarely carry particles into modes that only the new data support (thesis §5.1.5: the
    in-order estimate then drifts below the shuffled one).  A second run over the same ``n`` rows in
    a random order sees the data as stationary and finds those modes.

    Why replace rather than average: the re-annealing is triggered by the running run itself (a block
    that needed many annealing steps, i.e. a running population that is doing badly), so the running
    ``Ẑ_A`` is biased low *on the event that triggers*; averaging ``(Ẑ_A + Ẑ_B)/2`` on that event lost
    about ``log 2`` per merge (issue 10, measured in ``bench/conflict.py merges``).  The replay's ``Ẑ_B``
    uses only fresh randomness (its own prior draws, order and moves after the trigger), so
    ``E[Ẑ_B | trigger] = Z`` (thesis eq. 4.6 for the replay alone) and the replay's weighted particles
    are a properly weighted sample of ``p(θ | y_{1:n})`` whatever triggered it.  The step from
    ``log Ẑ_A`` to ``log Ẑ_B`` is reported as the block's ``log_evidence_correction``, not as part of its
    log-predictive.

    The replay keeps the warm-up population (``warmup_particles``) over all ``n`` rows and is reduced to
    ``particles`` only at its end: ``log Ẑ_B`` is unbiased in ``Ẑ`` but its downward (Jensen) bias in
    ``log Ẑ`` grows with the number of annealing steps a long history takes, and a small population misses
    modes.  Measured on the thesis stream (clusters 3 → 5 → 7, gmm-7 at 10 particles): a replay at
    n = 83,500 with 10 particles moved log Z by -345 nats; with the whole replay at 50 the in-order
    estimate ends within 0.013 % of the shuffled one (bench/README, thesis experiment).

    The fresh run is a model of its own (a stack of one) drawing from ``m.generator``; ``heartbeat``
    is called before each of its blocks.  ``state`` must hold its whole history (no reservoir).
    The anchors are reset at the new particles with exact history gradients (one more pass), and the
    replay's population is score-checked (:func:`workers.conflict.score_check`): its reason, or None,
    becomes the model's ``degraded``.

    Raises NumericalError when the fresh run fails.
    """
    history = state.history
    n = history.seen
    hx, hy = history.all_rows()
    order = torch.randperm(n, generator=m.generator, device=m.generator.device).to(hy.device)
    sx, sy = (hx[order] if hx is not None else None), hy[order]
    # the whole replay at the warm-up population's size (reduced to the running size at its end)
    replay = m.settings.model_copy(update={"reanneal_steps": None, "particles": m.settings.initial_particles})
    fresh = Slot(m.family, replay, m.generator, init_state(m.generator, m.family, replay))
    assert fresh.state is not None
    size = replay.block_size
    for start in range(0, n, size):
        if heartbeat is not None:
            heartbeat()
        p = _before_block(0, fresh, fresh.state, sx[start : start + size] if sx is not None else None,
                          sy[start : start + size], None)  # fmt: skip
        (info,) = _run_stack([p], None)
        if isinstance(info, sgais.NumericalError):
            raise info
    new = fresh.state
    M = state.theta.shape[0]
    if new.theta.shape[0] != M:  # a replay still in its warm-up population: back to the running size
        new = reduce_particles(m.generator, new, M)
    theta, velocity, log_w = new.theta, new.velocity, new.log_w
    one = StackedFamily.of(m.family, m.settings.torch_dtype, m.settings.torch_device)
    grad = history_gradient(one, theta[None], hx[None] if hx is not None else None, hy[None])[0]
    score = one.grad_log_prior(theta[None])[0] + grad
    return state._replace(
        theta=theta,
        velocity=velocity,
        log_w=log_w,
        anchor=theta.clone(),
        anchor_grad=grad,
        n_anchor=n,
        posterior_var=sgais.weighted_variance(theta[None], log_w[None], floor=new.posterior_var[None] / 4)[0],
        n_reanneal=n,
        evidence_var=new.evidence_var,  # the replay's error bar: it replaces the running estimate
        degraded=new.degraded or conflict.score_check(theta, log_w, score),
    )
