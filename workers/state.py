"""One model's state between blocks and what a block reports (the records :mod:`workers.stacking` keeps)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

from models.base import Family
from workers.history import History
from workers.settings import SamplerSettings

#: ``(log_w, evidence_var, log Ẑ, open-epoch variance, ESS, closed-epoch variance)``: :attr:`SGAISState.summary`
Summary = tuple[torch.Tensor, torch.Tensor, float, float, float, float]


class SGAISState(NamedTuple):
    """Particle state of one model after ``n`` observations.

    theta : [M, D] unconstrained particles.
    log_w : [M] float64 log-weights (unnormalised; ``log Ẑ_n = logsumexp(log_w) − log M``).
    velocity : [M, D] SGHMC velocities.
    anchor : [M, D] control-variate anchors (zeros until the first anchoring).
    anchor_grad : [M, D] ``Σ_{y∈H} ∇ log p(y|anchor_i)``.
    n_anchor : history size when the anchors were last set (0 = never).
    posterior_var : [D] float64 weighted particle variance per coordinate at the last annealing step.
    history : the observations absorbed so far (append-only).
    context : [p] last stream values for families with ``context_size`` > 0, else None.
    blocks : number of blocks absorbed.
    n_reanneal : history size at the last re-annealing (0 = never; :func:`reanneal`).
    n_change : history size after the last block that marked a change (``reanneal_steps``; 0 = none).
    evidence_var : [] float64 variance of ``log Ẑ`` (nats²) of the resampling epochs closed so far
        (:func:`workers.sgais.epoch_variance`); :attr:`log_evidence_var` adds the open epoch.  The end of
        the warm-up (:func:`workers.stacking.reduce_particles`) closes an epoch; after a re-annealing it is the
        replay's (:func:`workers.stacking.reanneal` replaces the running population and estimate), so the error
        bar stays that of the reported estimate.
    degraded : why the running ``log Ẑ`` is not certified (:mod:`workers.conflict`), or None; kept until a
        re-annealing replaces the estimate by one that passes the checks.
    summary : ``(log_w, evidence_var, log Ẑ, open-epoch variance, ESS, closed-epoch variance)`` computed for the
        whole stack at once by the kernel (:func:`summaries`), or None.  Used only while its first two entries *are*
        this state's ``log_w`` and ``evidence_var`` (a state rebuilt with others computes its own), so it can never go
        stale; not checkpointed.  Its numbers are Python floats read from the device once per stack: each read of a
        GPU tensor waits for the device (``bench/host_syncs.py``).
    """

    theta: torch.Tensor
    log_w: torch.Tensor
    velocity: torch.Tensor
    anchor: torch.Tensor
    anchor_grad: torch.Tensor
    n_anchor: int
    posterior_var: torch.Tensor
    history: History
    context: torch.Tensor | None
    blocks: int
    n_reanneal: int = 0
    n_change: int = 0
    evidence_var: torch.Tensor = torch.zeros((), dtype=torch.float64)
    degraded: str | None = None
    summary: Summary | None = None

    def _summary(self) -> Summary:
        if self.summary is not None and self.summary[0] is self.log_w and self.summary[1] is self.evidence_var:
            return self.summary
        return summaries(self.log_w[None], [self.log_w], self.evidence_var[None], [self.evidence_var])[0]

    @property
    def n(self) -> int:
        """Likelihood rows absorbed (observations, less any conditioned-on context values)."""
        return self.history.seen

    @property
    def log_evidence(self) -> float:
        """The reported log-evidence (nats): :attr:`log_evidence_uncorrected` + :attr:`log_evidence_var` / 2.

        ``Ẑ_n`` is (close to) unbiased for ``Z_n``, so its logarithm is biased low: by the lognormal central limit
        theorem of Bérard, Del Moral & Doucet (2014; the variance estimate comes from the same paper),
        ``log Ẑ_n − log Z_n`` is approximately ``N(−σ²/2, σ²)``, and adding ``σ̂²/2`` removes the bias to that order.
        Measured (``bench/calibration.py``, 48 seeds, n = 2,000 to 10⁵): the one-component gmm's mean error went
        from −0.01…−0.32 to +0.05…+0.15 nats; the linear regression's from −0.21…−1.40 to −0.15…−0.57 (the rest is
        SGHMC's own bias: +0.02…+0.19 with exact draws in place of the moves, ad hoc).  The correction assumes a
        small σ²: with an ESS near 1 (plain importance sampling from the prior, say) σ̂² reaches several nats² and so
        does the correction, inside an error bar as wide."""
        summary = self._summary()  # log_evidence_uncorrected + 0.5 * log_evidence_var, from one summary
        return summary[2] + 0.5 * (summary[5] + summary[3])

    @property
    def log_evidence_uncorrected(self) -> float:
        """``log Ẑ_n = logsumexp(log_w) − log M`` (nats), thesis eq. 4.6."""
        return self._summary()[2]

    @property
    def log_evidence_var(self) -> float:
        """Estimated Monte Carlo variance of ``log Ẑ_n`` (nats²): the closed epochs' ``evidence_var``
        plus the open epoch's :func:`workers.sgais.epoch_variance` of ``log_w``."""
        summary = self._summary()
        return summary[5] + summary[3]

    @property
    def log_evidence_se(self) -> float:
        """Monte Carlo standard error of ``log Ẑ_n`` (nats), ``sqrt(log_evidence_var)``."""
        summary = self._summary()
        return math.sqrt(max(summary[5] + summary[3], 0.0))

    @property
    def ess(self) -> float:
        """ESS of the current log-weights, in particles (:func:`workers.ess.ess`)."""
        return self._summary()[4]


def summaries(
    log_w: torch.Tensor, rows: list[torch.Tensor], evidence_var: torch.Tensor, closed: list[torch.Tensor]
) -> list[Summary]:
    """The :attr:`SGAISState.summary` of each model of a stack, three batched reductions and one read from the
    device for all of them.

    ``log_w: [K, M]`` float64; ``rows[k]`` the tensor the k-th state holds as its ``log_w`` (its row ``k``);
    ``evidence_var: [K]`` the closed epochs' variances, ``closed[k]`` the tensor the k-th state holds as its
    ``evidence_var``.  ``log Ẑ = logsumexp(log_w) − log M`` (thesis eq. 4.6), the open epoch's variance
    (:func:`workers.sgais.epoch_variance`) and the ESS (:func:`workers.ess.ess`), each row-wise, so a
    model's numbers do not depend on the stack it is in.
    """
    from workers.ess import ess
    from workers.sgais import epoch_variance

    log_z = torch.logsumexp(log_w, -1) - math.log(log_w.shape[-1])
    values = torch.stack([log_z, epoch_variance(log_w), ess(log_w), evidence_var.to(log_z)]).T.tolist()
    return [(row, c, *v) for row, c, v in zip(rows, closed, values, strict=True)]


class BlockInfo(NamedTuple):
    """Diagnostics of one absorbed block: the trace row, event and metrics, one to one."""

    observations: int  # rows in the block that entered the likelihood
    log_predictive: float  # log Ẑ_n − log Ẑ_{n_prev} (nats)
    log_evidence: float  # log Ẑ_n (nats)
    annealing_steps: int
    ess: float  # ESS of the full weights after the block, in particles
    resampled: bool  # resampled at least once in this block
    guard_tripped: bool  # max_annealing_steps reached; the rest of the block was taken in one increment
    reannealed: bool = False  # the population was replaced by a re-annealing over the history (reanneal)
    log_evidence_se: float = 0.0  # Monte Carlo standard error of log_evidence (nats), SGAISState.log_evidence_se
    # nats that log_evidence moved by besides log_predictive: a re-annealing's re-estimate of the whole
    # history, log Ẑ_replay − log Ẑ_running (API.md trace rows); 0 when none
    log_evidence_correction: float = 0.0
    degraded: str | None = None  # why the running log-evidence is not certified (the model's status), or None


class BlockLikelihoods(NamedTuple):
    """The per-row log-likelihoods of the last block a model absorbed, at its particles before the block (the
    first annealing step's, :attr:`workers.sgais.BlockStats.first_rows`); not checkpointed."""

    theta: torch.Tensor  # [M, D], the particles they were evaluated at: the state's own tensor (its identity marks it)
    rows: torch.Tensor  # log p(y_b | θ_m): [M, B] (nats)


class Model(Protocol):
    """What :func:`advance_stack` needs of a model (``ModelEngine`` has it)."""

    family: Family
    settings: SamplerSettings
    generator: torch.Generator
    state: SGAISState | None
    observations: int
    block_likelihoods: BlockLikelihoods | None  # set by advance_stack for each block


@dataclass
class Slot:
    """A bare model (used for the fresh run of :func:`reanneal`)."""

    family: Family
    settings: SamplerSettings
    generator: torch.Generator
    state: SGAISState | None
    observations: int = 0
    block_likelihoods: BlockLikelihoods | None = None
