"""Screening observations before they enter a stream: values whose log-likelihood is not finite.

A finite value such as ``1e308`` passes the NaN/inf checks of :meth:`models.base.Family.validate`, but
``(y − μ)²`` overflows, the log-likelihood of the block is ``-inf`` for every particle and the model stops
with ``NumericalError``; since a stream's log is immutable and a model added later replays it from the first
observation, every model of the stream, present and future, then failed for good (hardening review F4).

The check: each model of the stream evaluates its per-observation log-likelihood ``[P, B]`` at
:data:`PROBES` fixed draws from its prior (seed :data:`PROBE_SEED`, the model's dtype); a row whose
log-likelihood is not finite at any probe is refused.  Why prior draws, and why "any":

- Non-finite log-likelihoods of finite data come from overflow (``y²``, ``x·w``, ``exp``) or from
  ``log 0``; both are driven by the data's magnitude against the scale the prior gives the parameters,
  and prior draws have exactly that scale.  The sampler's particles start as prior draws (thesis §4.1),
  so a row non-finite at prior draws is non-finite where the sampler starts.
- The outcome hardly depends on the draw: overflowing values overflow at every draw (``1e308`` for a
  Gaussian likelihood: ``(1e308 − μ)² = inf`` for any moderate ``μ``).  Requiring finiteness at all
  four draws costs nothing for sensible data and refuses a row that would make some particles' weights
  NaN; the draws are fixed, so the decision is deterministic for a given model configuration.
- Families with context (autoregressive) are checked with a context of zeros, so every value of the
  chunk is screened as a target and as a lag.

This is a screen, not a proof: a value with a finite but enormous log-likelihood (``|y| ~ 1e150``) can
still make SGHMC diverge later; that is reported by the worker as the model's error.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from threading import Lock
from typing import NamedTuple

import torch

from models import Family, make_family
from models.stack import StackedFamily, stack_key_of

PROBES = 4
PROBE_SEED = 20_260_101
_DTYPES = {"float32": torch.float32, "float64": torch.float64}
_cache: OrderedDict[str, tuple[Family, torch.Tensor, torch.dtype]] = OrderedDict()
_cache_lock = Lock()
# each chunk looks up every model of its stream in order: a stream of more distinct configs than the cache holds would
# miss every one of them at every chunk (least-recently-used order), so the cache holds many (an entry: a family and
# its PROBES draws, a few kB)
_CACHE_SIZE = 4096
_stacks: OrderedDict[tuple[str, ...], tuple[StackedFamily, torch.Tensor]] = OrderedDict()
_STACKS_SIZE = 64


def _probe(config_key: str, family: Family | None = None) -> tuple[Family, torch.Tensor, torch.dtype]:
    """The family and its fixed prior draws ``theta: [PROBES, D]`` for a model configuration (cached).
    ``family``: the configuration's family if the caller built it already."""
    with _cache_lock:
        hit = _cache.get(config_key)
        if hit is not None:
            _cache.move_to_end(config_key)
            return hit
    family_name, params, dtype_name = json.loads(config_key)
    family = family if family is not None else make_family(family_name, params)
    dtype = _DTYPES.get(dtype_name, torch.float64)
    g = torch.Generator().manual_seed(PROBE_SEED)
    theta = family.sample_prior(g, PROBES, dtype=torch.float64).to(dtype)
    with _cache_lock:
        _cache[config_key] = (family, theta, dtype)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return family, theta, dtype


def prepare(cfg: dict, family: Family) -> None:
    """Draw and cache the probes of a new model (config ``cfg``, its ``family`` as built by the caller), so that the
    first chunk of its stream does not draw them.

    Why: the API registers a model once and screens every chunk of its stream with it; a stream's first chunk
    after 128 registrations drew the 128 models' probes (the family built again and four prior draws): 79 ms for
    that POST against 19-26 ms for the next ones (29 ms with the probes drawn at registration; ad hoc, one run each,
    bench/README.md, session 40)."""
    _probe(config_key(cfg), family)


def config_key(cfg: dict) -> str:
    """Cache key of a model config: family, hyperparameters and particle dtype."""
    return json.dumps([cfg["family"], cfg["params"], cfg.get("sampler", {}).get("dtype", "float64")], sort_keys=True)


def _layout(
    family: Family, x: torch.Tensor | None, y: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor | None, torch.Tensor] | None:
    """The stream's values as ``family`` reads them (validated, in ``dtype``, an AR family's first rows given a
    zero context): ``(x: [B, d] | None, y: [B, ...])``, or None for an empty chunk."""
    xm, ym = family.validate(x, y)
    if ym.shape[0] == 0:
        return None
    xm = xm.to(dtype) if xm is not None else None
    ym = ym.to(dtype)
    if family.context_size:
        context = ym.new_zeros((family.context_size, *ym.shape[1:]))
        xm, ym, _ = family.prepare(xm, ym, context)
    return xm, ym


def first_nonfinite_row(cfg: dict, x: torch.Tensor | None, y: torch.Tensor) -> tuple[int, str] | None:
    """The first row of a validated chunk whose log-likelihood under the model ``cfg`` is not finite.

    Parameters
    ----------
    cfg : dict
        A model config (``family``, ``params``, ``sampler.dtype``).
    x, y : Tensor
        The chunk as validated by the stream's schema: ``x: [B, d] | None``, ``y: [B] | [B, d]``.

    Returns
    -------
    (row, reason) or None
        ``row`` 0-based in the chunk.
    """
    family, theta, dtype = _probe(config_key(cfg))
    layout = _layout(family, x, y, dtype)
    if layout is None:
        return None
    xm, ym = layout
    with torch.no_grad():
        ll = family.log_likelihood(theta, xm, ym)  # [PROBES, B]
    bad = ~torch.isfinite(ll).all(dim=0)
    if not bool(bad.any()):
        return None
    row = int(bad.nonzero()[0, 0])
    value = ll[:, row]
    what = "NaN" if bool(torch.isnan(value).any()) else "infinite"
    return row, (
        f"log-likelihood is {what} under model {cfg['name']!r} ({cfg['family']}) at its prior draws: "
        "the value is too large (or impossible) for the model"
    )


def _stacked_probe(keys: tuple[str, ...]) -> tuple[StackedFamily, torch.Tensor]:
    """The stacked family and probe draws ``theta: [K, PROBES, D]`` of models with one stack key and dtype
    (cached by their config keys: a stream's models are screened together at every chunk)."""
    with _cache_lock:
        hit = _stacks.get(keys)
        if hit is not None:
            _stacks.move_to_end(keys)
            return hit
    probes = [_probe(k) for k in keys]
    dtype = probes[0][2]
    stacked = StackedFamily([f for f, _, _ in probes], dtype, "cpu"), torch.stack([t for _, t, _ in probes])
    with _cache_lock:
        _stacks[keys] = stacked
        while len(_stacks) > _STACKS_SIZE:
            _stacks.popitem(last=False)
    return stacked


class Plan(NamedTuple):
    """How a stream's models are screened together (:func:`plan`): ``configs`` as given, and per stack key and dtype the
    indices of its models in ``configs`` with their config keys (:func:`config_key`)."""

    configs: list[dict]
    groups: list[tuple[list[int], tuple[str, ...]]]


def plan(configs: list[dict]) -> Plan:
    """The :class:`Plan` of a stream's models: their probes drawn (:func:`_probe`, cached) and grouped by stack key and
    dtype.  Costs a config key (a ``json.dumps``) and a cache lookup per model, so a caller that screens every chunk of
    a stream keeps the plan while the stream's models stay the same (``service.routes.chunks.stream_configs``)."""
    groups: dict[tuple, list[int]] = {}
    keys = [config_key(cfg) for cfg in configs]
    for i, key in enumerate(keys):
        family, _, dtype = _probe(key)
        groups.setdefault((stack_key_of(family), dtype), []).append(i)
    return Plan(configs, [(members, tuple(keys[i] for i in members)) for members in groups.values()])


def first_nonfinite_row_among(
    configs: list[dict] | Plan, x: torch.Tensor | None, y: torch.Tensor
) -> tuple[int, str] | None:
    """:func:`first_nonfinite_row` over every model of a stream (``configs``, or their :func:`plan`): the earliest row
    refused by any of them (the first such model in ``configs`` order names the reason), or None.

    The models are screened in one stacked log-likelihood evaluation per stack key and dtype
    (:class:`models.stack.StackedFamily`, ``[K, PROBES, B]``) rather than one evaluation per model: a stream of
    128 models cost the API 128 evaluations per chunk (issue 9).  Each model's probes are its own fixed prior
    draws, as in :func:`first_nonfinite_row`, so the decision is each model's own.
    """
    configs, groups = configs if isinstance(configs, Plan) else plan(configs)
    worst: tuple[int, int, str] | None = None  # (row, config index, reason)
    for members, keys in groups:
        stacked, theta = _stacked_probe(keys)
        layout = _layout(stacked.family, x, y, theta.dtype)
        if layout is None:
            return None
        xm, ym = layout
        K = len(members)
        xs = xm[None].expand(K, *xm.shape) if xm is not None else None
        with torch.no_grad():
            ll = stacked.log_likelihood(theta, xs, ym[None].expand(K, *ym.shape))  # [K, PROBES, B]
        bad = ~torch.isfinite(ll).all(dim=1)  # [K, B]
        if not bool(bad.any()):
            continue
        for k in bad.any(dim=1).nonzero()[:, 0].tolist():
            row = int(bad[k].nonzero()[0, 0])
            i = members[k]
            if worst is None or (row, i) < worst[:2]:
                value = ll[k, :, row]
                what = "NaN" if bool(torch.isnan(value).any()) else "infinite"
                cfg = configs[i]
                worst = (row, i, f"log-likelihood is {what} under model {cfg['name']!r} ({cfg['family']}) at its "
                         "prior draws: the value is too large (or impossible) for the model")  # fmt: skip
    return None if worst is None else (worst[0], worst[2])
