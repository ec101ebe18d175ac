"""One model's SGAIS engine: family + settings + generator + state, with checkpoints.

This is the object the runner holds per leased model.  It is a thin mutable shell around the
stacked kernel (:mod:`workers.sgais`) and its policies (:mod:`workers.stacking`): it keeps the
``torch.Generator`` whose state is checkpointed, and serialises the whole state to bytes
(safetensors for tensors, a JSON header in its metadata), one checkpoint per model.

Many models at once (the worker's API)::

    from workers.stacking import advance_stack, stack_key

    results = advance_stack(engines, [(x_i, y_i) for each engine], validated=True)
    # results[i]: list[BlockInfo] for engines[i] (exactly what engines[i].update(x_i, y_i) returns
    # alone, bit for bit), or the NumericalError that stopped engines[i] (its earlier blocks stay
    # absorbed, the failing block is not; the other engines are unaffected).

Engines are grouped internally, per block, into stacks of equal :func:`~workers.stacking.stack_key`
(family and shape hyperparameters, sampler settings that change shapes or control flow, dtype,
device), particle count and block length; hyperparameters such as prior scales, and settings
such as seed, learning rate, momentum decay, ESS target and burn-in, may differ within a stack.
:meth:`ModelEngine.update` is ``advance_stack([self], [(x, y)])``.  Checkpoints
(:meth:`ModelEngine.to_bytes`) stay per model, so a model restored into another stack
composition continues bit for bit.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable
from typing import Any

import torch
from safetensors import TensorSpec, serialize
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from models import Family, make_family
from models.base import CovariateSubset
from workers.ess import ess
from workers.history import History
from workers.settings import SamplerSettings
from workers.stacking import BlockInfo, Heartbeat, SGAISState, advance_stack, init_state
from workers.state import BlockLikelihoods

CHECKPOINT_VERSION = 1
log = logging.getLogger(__name__)

# Model comparison on the same observations (DESIGN.md §9, API.md "Model comparison") needs every
# model's running log-evidence at the stream's largest context c (the largest AR order of its models):
# log p(y_{c+1..n} | y_{1..c}) = log Ẑ_n − log Ẑ_c.  Trace rows exist only at block ends, so the worker
# (workers/runner.py) absorbs the stream's first SINGLE_OBSERVATION_BLOCKS values as one-observation
# blocks: every model then has a row at each count c ≤ this bound, whatever the chunking and whichever
# model joins later.  Larger contexts are compared from the first count ≥ c where every model has a row
# (a chunk end at worst; workers.comparison.next_common_count).  Why 2 and not the AR order limit (1000):
# one-observation blocks of real data cost 1-2 annealing steps each, and an AR(2) model (3 parameters)
# absorbing y_3 alone after extreme lags (y_1 = 5, y_2 = -4, seed 21) diverged (SGHMC NaN), where the
# 500-observation block is 0.16 nats from exact.  With 2, an AR(p ≥ 2) model's split values are all
# context (no annealing), and AR(1)/i.i.d. models absorb at most two values alone.  ModelEngine.update
# keeps plain block_size blocks (the kernel's behaviour is unchanged); the history it rebuilds does not
# depend on the split (prepare() gives the same rows).
SINGLE_OBSERVATION_BLOCKS = 2


def block_bounds(done: int, n: int, block_size: int) -> list[tuple[int, int]]:
    """``(start, stop)`` offsets of the worker's blocks in a chunk of ``n`` values after ``done`` absorbed ones.

    Blocks of ``block_size``, except that the stream's first :data:`SINGLE_OBSERVATION_BLOCKS` values are
    one block each (see there).  Each block goes to :meth:`ModelEngine.update` on its own.
    """
    bounds, start = [], 0
    while start < n and done + start < SINGLE_OBSERVATION_BLOCKS:
        bounds.append((start, start + 1))
        start += 1
    bounds += [(a, min(a + block_size, n)) for a in range(start, n, block_size)]
    return bounds


class ModelEngine:
    """SGAIS for one model.

    Parameters
    ----------
    family : str | Family
        Registered family name (``models.FAMILIES``), or a family instance used as it is (``params`` ignored).
    params : dict
        The family's hyperparameters.
    sampler : SamplerSettings | dict
        SGAIS settings (defaults filled in).
    """

    def __init__(
        self,
        family: str | Family,
        params: dict[str, Any] | None = None,
        sampler: SamplerSettings | dict[str, Any] | None = None,
        *,
        _init_state: bool = True,
    ):
        # a Family instance is shared as it is (hyperparameters frozen; ``params`` ignored): a model's challengers
        # use the model's own instance rather than validating the same hyperparameters again
        self.family: Family = family if isinstance(family, Family) else make_family(family, params)
        self.settings = sampler if isinstance(sampler, SamplerSettings) else SamplerSettings(**(sampler or {}))
        self.generator = torch.Generator(device=self.settings.torch_device)
        self.generator.manual_seed(self.settings.seed)
        self.observations = 0  # stream values absorbed (including conditioned-on context values)
        # stream values before the first block whose Monte Carlo error log_evidence_se counts: 0, or the
        # observations of a checkpoint written before the error bars (CHECKPOINT_VERSION 1 without evidence_var)
        self.evidence_var_since = 0
        self.state: SGAISState | None = None
        self.block_likelihoods: BlockLikelihoods | None = None  # the last block's rows (workers.stacking)
        if _init_state:
            self.state = init_state(self.generator, self.family, self.settings)

    # ----- updating --------------------------------------------------------------------------
    def update(self, x: Any, y: Any, *, validated: bool = False, heartbeat: Heartbeat = None) -> list[BlockInfo]:
        """Absorb a chunk, split into blocks of ``block_size``; one BlockInfo per block.

        ``x``/``y`` are validated by the family unless ``validated``.  ``heartbeat`` (deprecated: the
        worker renews its leases from a thread) is called between the blocks of a re-annealing.

        Raises
        ------
        models.ObservationError
            Invalid observations (nothing is absorbed).
        workers.sgais.NumericalError
            NaN/inf during the update; blocks before the failing one stay absorbed.
        """
        (result,) = advance_stack([self], [(x, y)], validated=validated, heartbeat=heartbeat)
        self.block_likelihoods = None  # read only by workers.segmented within its own call
        if isinstance(result, Exception):
            raise result
        return result

    @property
    def _st(self) -> SGAISState:
        if self.state is None:
            raise RuntimeError("the engine has no state")
        return self.state

    @property
    def log_evidence(self) -> float:
        """Running ``log Ẑ`` (nats)."""
        return self._st.log_evidence

    @property
    def log_evidence_se(self) -> float:
        """Monte Carlo standard error of :attr:`log_evidence` (nats; :attr:`SGAISState.log_evidence_se`)."""
        return self._st.log_evidence_se

    @property
    def degraded(self) -> str | None:
        """Why the running ``log Ẑ`` is not certified (the model's ``degraded`` status reason), or None."""
        return self._st.degraded

    @property
    def ess(self) -> float:
        return self._st.ess

    # ----- posterior --------------------------------------------------------------------------
    def posterior_summary(self) -> dict[str, Any]:
        """Weighted mean, std and 5%/95% quantiles of every constrained parameter (:func:`posterior_summary`)."""
        return posterior_summary(self.family, self._st.theta, self._st.log_w, self.observations)

    # ----- checkpoints ------------------------------------------------------------------------
    def to_bytes(self, *, include_history: bool = True) -> bytes:
        """Serialise the whole state (safetensors with a JSON header in its metadata).

        With ``include_history=False`` the history rows are left out (the runner
        rebuilds them from the stream log, DESIGN.md §2); the reservoir generator
        is always kept.
        """
        s = self._st
        tensors = {
            "theta": s.theta,
            "log_w": s.log_w,
            "velocity": s.velocity,
            "anchor": s.anchor,
            "anchor_grad": s.anchor_grad,
            "posterior_var": s.posterior_var,
            "generator": self.generator.get_state(),
            "evidence_var": s.evidence_var.reshape(1),
        }
        if s.context is not None:
            tensors["context"] = s.context
        if include_history:
            tensors.update(s.history.state_tensors())
        else:
            tensors["history.generator"] = s.history.generator.get_state()
        header = {
            "observations": self.observations,
            "n_anchor": s.n_anchor,
            "n_reanneal": s.n_reanneal,
            "n_change": s.n_change,
            "degraded": s.degraded,
            "blocks": s.blocks,
            "history_seen": s.history.seen,
            "history_included": include_history,
            "evidence_var_since": self.evidence_var_since,
        }
        return safetensors_bytes(tensors, {"sgais": self._header_prefix() + json.dumps(header)[1:]})

    def view_bytes(self) -> bytes:
        """The posterior's particles for the readers of a checkpoint (``GET …/posterior`` and ``…/predictive``:
        :func:`read_checkpoint`): :meth:`to_bytes` with ``theta``, ``log_w``, ``context`` and the generator's state
        (the predictive's simulations start from a copy of it) only: no velocities, anchors or history stream, so it
        cannot restore the engine.  A live model stores it with each chunk whose full state is deferred
        (:meth:`workers.worker.loop.Worker.commit_call`), and not the challengers' states."""
        s = self._st
        tensors = {"theta": s.theta, "log_w": s.log_w, "generator": self.generator.get_state()}
        if s.context is not None:
            tensors["context"] = s.context
        header = {"observations": self.observations, "blocks": s.blocks, "view": True}
        return safetensors_bytes(tensors, {"sgais": self._header_prefix() + json.dumps(header)[1:]})

    def _header_prefix(self) -> str:
        """The checkpoint header's first members (version, family, params, sampler) as JSON text up to the next
        member: the same text ``json.dumps`` gives inside the whole header, encoded once per family and settings
        (the settings object is replaced, never changed: it is frozen)."""
        key = (self.family, self.settings)
        cached = self.__dict__.get("_prefix")
        if cached is None or cached[0][0] is not key[0] or cached[0][1] is not key[1]:
            head = {
                "version": CHECKPOINT_VERSION,
                "family": self.family.name,
                "params": self.family.params.model_dump(),
                "sampler": self.settings.model_dump(),
            }
            cached = self.__dict__["_prefix"] = (key, json.dumps(head)[:-1] + ", ")
        return cached[1]

    @classmethod
    def from_bytes(cls, data: bytes, *, history_blocks: Iterable[tuple[Any, Any]] | None = None) -> ModelEngine:
        """Restore an engine saved by :meth:`to_bytes`.

        ``history_blocks`` — the stream's raw ``(x, y)`` chunks from the start, in order,
        covering at least the absorbed observations — rebuilds the history when the
        checkpoint was written without it.

        Raises
        ------
        ValueError
            Unknown checkpoint version, history missing and not rebuildable, or a :meth:`view_bytes` (it holds
            no random streams or velocities).
        """
        header = json.loads(_metadata(data)["sgais"])
        if header["version"] != CHECKPOINT_VERSION:
            raise ValueError(f"checkpoint version {header['version']} is not supported")
        if header.get("view"):
            raise ValueError("a posterior view (ModelEngine.view_bytes) cannot restore an engine")
        eng = cls(header["family"], header["params"], SamplerSettings(**header["sampler"]), _init_state=False)
        device = eng.settings.torch_device
        t = {k: v.to(device) for k, v in st_load(data).items()}
        eng.generator.set_state(t["generator"].cpu() if device.type == "cpu" else t["generator"])
        eng.observations = header["observations"]
        if "evidence_var" in t:
            evidence_var = t["evidence_var"].to(torch.float64).reshape(())
            eng.evidence_var_since = int(header.get("evidence_var_since", 0))
        else:  # written before the error bars: the variance of the earlier blocks is unknown, counted as 0
            evidence_var = torch.zeros((), dtype=torch.float64, device=device)
            eng.evidence_var_since = eng.observations
            log.warning(
                "checkpoint without evidence_var: log_evidence_se counts only the Monte Carlo error after "
                "observation %d (the earlier blocks' is unknown)",
                eng.observations,
            )
        history = History(
            capacity=eng.settings.history_capacity,
            seed=eng.settings.seed,
            dtype=eng.settings.torch_dtype,
            device=device,
        )
        if header["history_included"]:
            history.load_state_tensors(t, header["history_seen"])
        else:
            if history_blocks is None and header["history_seen"] > 0:
                raise ValueError("checkpoint has no history rows: pass history_blocks to rebuild them")
            eng._rebuild_history(history, history_blocks or [], header["observations"])
            if history.seen != header["history_seen"]:
                raise ValueError(
                    f"rebuilt history has {history.seen} rows, checkpoint expects {header['history_seen']}"
                )
            history.generator.set_state(t["history.generator"].cpu())
        eng.state = SGAISState(
            theta=t["theta"],
            log_w=t["log_w"],
            velocity=t["velocity"],
            anchor=t["anchor"],
            anchor_grad=t["anchor_grad"],
            n_anchor=header["n_anchor"],
            posterior_var=t["posterior_var"],
            history=history,
            context=t.get("context"),
            blocks=header["blocks"],
            n_reanneal=header.get("n_reanneal", 0),
            n_change=header.get("n_change", 0),
            evidence_var=evidence_var,
            degraded=header.get("degraded"),
        )
        return eng

    def _rebuild_history(self, history, blocks: Iterable[tuple[Any, Any]], observations: int) -> None:
        """Replay the first ``observations`` stream values through ``prepare`` into ``history``."""
        context = None
        done = 0
        dtype, device = self.settings.torch_dtype, self.settings.torch_device
        size = self.settings.block_size
        for x, y in blocks:
            if done >= observations:
                break
            x, y = self.family.validate(x, y)
            take = min(y.shape[0], observations - done)
            x, y = (x[:take] if x is not None else None), y[:take]
            # identical block splitting to update(): prepare() sees the same blocks
            for start in range(0, take, size):
                xb = x[start : start + size].to(dtype=dtype, device=device) if x is not None else None
                yb = y[start : start + size].to(dtype=dtype, device=device)
                xr, yr, context = self.family.prepare(xb, yb, context)
                history.append(xr, yr)
            done += take
        if done < observations:
            raise ValueError(f"stream log holds {done} observations, checkpoint absorbed {observations}")


def posterior_summary(family: Family, theta: torch.Tensor, log_w: torch.Tensor, observations: int) -> dict[str, Any]:
    """Weighted mean, std and 5%/95% quantiles of every constrained parameter.

    ``theta: [M, D]`` unconstrained particles, ``log_w: [M]`` their log-weights.  Returns
    ``{"observations", "ess", "parameters": {name: {"shape", "mean", "std", "q05", "q95"}}}``
    (values nested like the parameter's shape).  A parameter with an axis over the model's covariates
    (regression weights) also has ``"covariates": {"axis": a, "names": [...]}``: the stream's column name of
    each entry along that axis (:meth:`models.base.CovariateSubset.covariate_labels`).
    """
    axes: dict[str, int] = getattr(family, "covariate_axes", {})
    labels: list[str] = family.covariate_labels() if isinstance(family, CovariateSubset) else []
    values, _ = family.space.constrain(theta)
    W = torch.softmax(log_w, 0)
    out: dict[str, dict[str, Any]] = {}
    for spec in family.space.specs:
        v = values[spec.name].to(torch.float64).reshape(W.shape[0], -1)  # [M, P]
        mean = (W[:, None] * v).sum(0)
        var = (W[:, None] * (v - mean) ** 2).sum(0)
        order = torch.argsort(v, dim=0)
        cw = torch.cumsum(W[order], 0)  # [M, P]

        def quantile(q: float, cw: torch.Tensor = cw, v: torch.Tensor = v, order: torch.Tensor = order) -> torch.Tensor:
            pos = torch.searchsorted(
                cw.T.contiguous(), torch.full((v.shape[1], 1), q, dtype=cw.dtype, device=cw.device)
            ).clamp(max=W.shape[0] - 1)[:, 0]
            return v.gather(0, order.gather(0, pos[None, :]))[0]

        shape = list(spec.shape)
        out[spec.name] = {
            "shape": shape,
            "mean": mean.reshape(shape).tolist(),
            "std": var.sqrt().reshape(shape).tolist(),
            "q05": quantile(0.05).reshape(shape).tolist(),
            "q95": quantile(0.95).reshape(shape).tolist(),
        }
        if spec.name in axes:
            out[spec.name]["covariates"] = {"axis": axes[spec.name], "names": labels}
    return {"observations": observations, "ess": float(ess(log_w)), "parameters": out}


def read_checkpoint(data: bytes) -> tuple[dict[str, Any], dict[str, torch.Tensor], Family]:
    """The header, tensors (``theta: [M, D]``, ``log_w: [M]``, ``generator``, ``context``, ...) and family of a
    checkpoint written by :meth:`ModelEngine.to_bytes` or :meth:`ModelEngine.view_bytes`, on the CPU, for read-only
    uses (posterior summaries, the predictive); the history is not needed.

    Raises
    ------
    ValueError
        Unknown checkpoint version.
    """
    header = json.loads(_metadata(data)["sgais"])
    if header["version"] != CHECKPOINT_VERSION:
        raise ValueError(f"checkpoint version {header['version']} is not supported")
    return header, st_load(data), make_family(header["family"], header["params"])


def posterior_summary_from_bytes(data: bytes) -> dict[str, Any]:
    """:func:`posterior_summary` of a checkpoint (:func:`read_checkpoint`; raises what it raises)."""
    header, t, family = read_checkpoint(data)
    return posterior_summary(family, t["theta"], t["log_w"], header["observations"])


def _metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors byte string (its JSON header)."""
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n]).get("__metadata__", {})


#: safetensors' names of the dtypes a checkpoint holds (those of ``numpy.dtype.name``, as its numpy writer gives)
_SAFETENSORS_DTYPES = {
    torch.float64: "float64",
    torch.float32: "float32",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.uint8: "uint8",
    torch.bool: "bool",
}


def safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """``tensors`` (any device, any strides) and ``metadata`` as safetensors bytes: the bytes of
    ``safetensors.torch.save`` (and of ``safetensors.numpy.save``), written by :func:`safetensors.serialize` from
    the tensors' own memory.  On a checkpoint's small tensors 10 µs, against 41 for the numpy writer (its time
    goes to numpy dtype introspection) and 95 for the torch writer, which stays the path of a big-endian host
    (safetensors is little-endian) or a dtype not in :data:`_SAFETENSORS_DTYPES`."""
    # alive while serialize reads them; a checkpoint's tensors are CPU, contiguous and without grad already, and
    # the three copies' calls were a third of a challenger's to_bytes (session 26)
    held = {k: v if _plain(v) else v.detach().contiguous().cpu() for k, v in tensors.items()}
    if sys.byteorder != "little":
        return st_save(held, metadata=metadata)
    specs = {}
    for k, v in held.items():
        name = _SAFETENSORS_DTYPES.get(v.dtype)
        if name is None:
            return st_save(held, metadata=metadata)
        specs[k] = TensorSpec(dtype=name, shape=v.shape, data_ptr=v.data_ptr(), data_len=v.nbytes)
    return bytes(serialize(specs, metadata=metadata))


def _plain(v: torch.Tensor) -> bool:
    """A CPU tensor without grad whose memory is its values in order: serialised from where it is."""
    return v.is_cpu and not v.requires_grad and v.is_contiguous()
