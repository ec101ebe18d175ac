"""The protocol every model family follows.

A family is *what a model is*: a pydantic schema for its hyperparameters, an
observation schema with validation, its parameters with their constraints, and
vectorised ``log_prior`` / ``log_likelihood``.  The sampler only ever sees the
unconstrained parameter vector ``theta: [M, D]``; :class:`ParameterSpace` maps
it to named constrained tensors with ``torch.distributions.biject_to`` and
returns the log-|Jacobian| that turns the prior density on the constrained
space into a density on R^D (standard change of variables, e.g. NumPyro's
``biject_to`` / Stan reference manual, "Changes of variables").
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from torch.distributions import biject_to, constraints

from models.densities import LOG_2PI, bmm, normal_log_prob  # noqa: F401  (re-exported)


class ObservationError(ValueError):
    """An observation block failed validation.

    Attributes
    ----------
    field : str
        ``"x"`` or ``"y"`` (or ``"seq"`` and friends at the service layer).
    row : int | None
        0-based row inside the chunk, when the problem is in one row.
    reason : str
        Human-readable reason.
    """

    def __init__(self, field: str, reason: str, row: int | None = None):
        self.field = field
        self.row = row
        self.reason = reason
        where = f"{field}[{row}]" if row is not None else field
        super().__init__(f"{where}: {reason}")


class HyperParams(BaseModel):
    """Base class of every family's hyperparameter schema (unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


MAX_COVARIATES = 10_000


class CovariateParams(HyperParams):
    """The covariate fields of the regression families: which of the stream's ``x`` columns a model uses.

    ``features`` is either ``d`` (the model uses all ``d`` columns of ``x``) or a list of column indices
    (0-based) or names; with a list, ``columns`` gives the stream's columns (their number, or their names),
    so that models with different covariate subsets can share one stream.
    """

    columns: Annotated[int, Field(ge=1, le=MAX_COVARIATES)] | list[str] | None = Field(
        None,
        description=(
            "the stream's covariate columns: their number, or their names (a list of strings); null = "
            "`features` columns. Needed when `features` lists columns; every model of a stream gives the same"
        ),
    )
    features: (
        Annotated[int, Field(ge=1, le=MAX_COVARIATES)]
        | Annotated[list[int | str], Field(min_length=1, max_length=MAX_COVARIATES)]
    ) = Field(
        ...,
        description=(
            "the covariates the model uses: d (all d columns of x), or a list of 0-based column indices or "
            "column names (from `columns`) selecting a subset of the stream's x"
        ),
    )

    @field_validator("columns")
    @classmethod
    def _distinct_names(cls, v: int | list[str] | None) -> int | list[str] | None:
        if isinstance(v, list):
            if not 1 <= len(v) <= MAX_COVARIATES:
                raise ValueError(f"give 1..{MAX_COVARIATES} column names")
            if len(set(v)) != len(v):
                raise ValueError("column names must be distinct")
        return v

    @field_validator("features")
    @classmethod
    def _features_in_columns(cls, v: int | list[int | str], info: ValidationInfo) -> int | list[int | str]:
        if "columns" not in info.data:  # columns itself is invalid: reported there
            return v
        columns_of(v, info.data["columns"])
        return v

    @property
    def stream_columns(self) -> int:
        """The width of the stream's ``x`` rows."""
        return columns_of(self.features, self.columns)[0]

    @property
    def selected(self) -> list[int] | None:
        """0-based indices of the columns this model uses, or None for all of them."""
        return columns_of(self.features, self.columns)[1]

    @property
    def n_features(self) -> int:
        """d, the number of covariates the model uses."""
        f = self.features
        return f if isinstance(f, int) else len(f)

    @property
    def column_names(self) -> list[str] | None:
        return self.columns if isinstance(self.columns, list) else None


def columns_of(features: int | list[int | str], columns: int | list[str] | None) -> tuple[int, list[int] | None]:
    """``(width of the stream's x, selected 0-based indices or None for all)``.

    Raises
    ------
    ValueError
        A list of ``features`` without ``columns``, an index out of range, an unknown name, a duplicate, or
        ``features`` as a number that differs from the stream's columns (the message names the field).
    """
    if columns is None:
        if isinstance(features, list):
            raise ValueError("a list of features needs `columns`, the stream's covariate columns (number or names)")
        return features, None
    names = columns if isinstance(columns, list) else None
    width = len(columns) if isinstance(columns, list) else columns
    if isinstance(features, int):
        if features != width:
            raise ValueError(f"{features} features but the stream has {width} columns; list the columns to use")
        return width, None
    idx: list[int] = []
    for f in features:
        if isinstance(f, str):
            if names is None or f not in names:
                known = f"; known: {names}" if names else " (give `columns` as a list of names to use names)"
                raise ValueError(f"unknown column name {f!r}{known}")
            idx.append(names.index(f))
        else:
            if not 0 <= f < width:
                raise ValueError(f"column index {f} out of range 0..{width - 1}")
            idx.append(f)
    if len(set(idx)) != len(idx):
        raise ValueError("a column is selected twice")
    return width, idx


class CovariateSubset:
    """Mixin of the families with covariates: the stream's ``x`` rows are validated at their full width, then
    the model's columns (``params.features``) are selected."""

    params: Any

    def x_schema(self) -> dict[str, Any]:
        """The ``x`` part of the observation schema: the stream's width, and its column names when given."""
        p = self.params
        out: dict[str, Any] = {"x": p.stream_columns}
        if p.column_names is not None:
            out["x_names"] = list(p.column_names)
        return out

    def stream_covariates(self, x: Any, family: str) -> torch.Tensor:
        """Validate ``x`` rows of the stream's width: ``[B, columns]`` float64 (every column checked)."""
        require_x(x, family)
        return as_matrix(x, "x", self.params.stream_columns)

    #: ``{parameter name: axis}``: the axis of each parameter that runs over the model's covariates.
    covariate_axes: dict[str, int] = {}

    def covariate_labels(self) -> list[str]:
        """One label per covariate the model uses, in its order: the stream's column name where ``columns``
        names them, else ``x[i]`` (``i`` the 0-based column of the stream's ``x``)."""
        p = self.params
        idx = p.selected if p.selected is not None else list(range(p.stream_columns))
        names = p.column_names
        return [names[i] if names is not None else f"x[{i}]" for i in idx]

    def validate_stream(self, x: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The chunk as the stream stores it (all of its ``x`` columns); :meth:`validate` selects this model's."""
        raise NotImplementedError

    def validate(self, x: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`validate_stream`, then this model's columns: ``(x: [B, d], y)``."""
        xt, yt = self.validate_stream(x, y)
        sel = self.params.selected
        return (xt if sel is None else xt[:, sel].contiguous()), yt


@dataclass(frozen=True)
class ParameterSpec:
    """One named parameter: its constrained shape and its support."""

    name: str
    shape: tuple[int, ...]
    constraint: constraints.Constraint = constraints.real

    @property
    def transform(self) -> torch.distributions.Transform:
        return biject_to(self.constraint)

    @property
    def unconstrained_shape(self) -> tuple[int, ...]:
        return tuple(self.transform.inverse_shape(torch.Size(self.shape)))

    @property
    def unconstrained_size(self) -> int:
        return int(math.prod(self.unconstrained_shape))


def _exp(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``biject_to(constraints.positive)`` (``ExpTransform`` then ``AffineTransform(0, 1)``) and its log-|J|,
    written out: ``(exp(u), u)``, the same bits (``0 + 1·exp(u)`` and ``u + log 1`` are exact)."""
    return u.exp(), u


def stick_breaking_offsets(u: torch.Tensor) -> torch.Tensor:
    """The offsets ``C−1−i: [C−1]`` of ``torch.distributions.StickBreakingTransform`` for its coordinates
    ``u: [..., C−1]`` (``z_i = σ(u_i − log offset_i)``), computed as torch computes them."""
    return u.shape[-1] + 1 - u.new_ones(u.shape[-1]).cumsum(-1)


_OFFSETS: dict[tuple[int, torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def stick_breaking_constants(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(offset, log offset): [C−1]`` of :func:`stick_breaking_offsets` for ``u: [..., C−1]``, made once per length,
    dtype and device (the same values: a mixture's SGHMC step used them 4 times, 4 tensor calls each)."""
    key = (u.shape[-1], u.dtype, u.device)
    if key not in _OFFSETS:
        offset = stick_breaking_offsets(u)
        _OFFSETS[key] = (offset, offset.log())
    return _OFFSETS[key]


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """``σ(x) = exp(log σ(x))``, elementwise: the same bits for an element wherever it lies in its tensor.

    ``torch.sigmoid``'s vectorised loop and its scalar loop (the tensor's last few elements) round differently: 759
    of 30,000 float64 inputs differed in the last bit on this machine (session 30; ``exp``, ``logsigmoid``, ``log``,
    ``lgamma`` and ``tanh`` agreed on all), so a model's value depended on how many models shared its stack.
    Within an ulp or two of ``torch.sigmoid``."""
    return torch.exp(F.logsigmoid(x))


def _stick_breaking(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.distributions.StickBreakingTransform`` of ``u: [..., C−1]`` and its log-|J| ``[...]``, torch 2.x's
    ``_call`` and ``log_abs_det_jacobian`` arithmetic with :func:`sigmoid` for ``torch.sigmoid`` (so within an ulp or
    two of torch's, and the same bits for a model in any stack), without the ``Transform`` machinery (measured: half
    the cost of :meth:`ParameterSpace.constrain` for a gmm).  One component (``C − 1 = 0``: a one-component gmm's
    weights) is the point ``y = 1`` with log-|J| 0, returned without the arithmetic (the same bits: ``1·1`` and an
    empty sum)."""
    if u.shape[-1] == 0:
        return u.new_ones(*u.shape[:-1], 1), u.new_zeros(u.shape[:-1])
    x = u - stick_breaking_constants(u)[1]
    finfo = torch.finfo(u.dtype)
    z = torch.clamp(sigmoid(x), min=finfo.tiny, max=1.0 - finfo.eps)
    y = F.pad(z, [0, 1], value=1) * F.pad((1 - z).cumprod(-1), [1, 0], value=1)
    return y, (-x + F.logsigmoid(x) + y[..., :-1].log()).sum(-1)


#: Constraints whose transforms :meth:`ParameterSpace.constrain` writes out (by identity of the constraint object).
_LEAN = {id(constraints.positive): "positive", id(constraints.simplex): "simplex"}


class ParameterSpace:
    """Maps ``theta: [..., D]`` (unconstrained) to named constrained tensors.

    Parameters
    ----------
    specs : sequence of ParameterSpec
        In the order their blocks appear in ``theta``.

    The transforms are built once; real-valued blocks skip theirs (identity, log-|J| = 0), so the
    hot path of a family with unconstrained parameters is slicing and reshaping only.
    """

    def __init__(self, specs: Sequence[ParameterSpec]):
        self.specs = tuple(specs)
        self.slices: dict[str, slice] = {}
        self.transforms: dict[str, torch.distributions.Transform | None] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.lean: dict[str, str | None] = {}  # "positive" / "simplex": written out in constrain, else None
        start = 0
        for spec in self.specs:
            size = spec.unconstrained_size
            self.slices[spec.name] = slice(start, start + size)
            self.transforms[spec.name] = None if spec.constraint is constraints.real else spec.transform
            self.shapes[spec.name] = spec.unconstrained_shape
            self.lean[spec.name] = _LEAN.get(id(spec.constraint))
            start += size
        self.dim = start

    def constrain(self, theta: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Unconstrained ``theta: [..., D]`` -> ({name: [..., *shape]}, log|J|: [...]).

        ``log|J|`` is the sum of each transform's ``log_abs_det_jacobian``
        (``torch.distributions.Transform``), reduced over event dimensions.
        """
        lead = theta.shape[:-1]
        values: dict[str, torch.Tensor] = {}
        log_det = theta.new_zeros(lead)
        for spec in self.specs:
            u = theta[..., self.slices[spec.name]].reshape(*lead, *self.shapes[spec.name])
            t = self.transforms[spec.name]
            if t is None:
                values[spec.name] = u
                continue
            lean = self.lean[spec.name]
            if lean == "positive":
                c, jac = _exp(u)
            elif lean == "simplex":
                c, jac = _stick_breaking(u)
            else:
                c = t(u)
                jac = t.log_abs_det_jacobian(u, c)
            log_det = log_det + jac.reshape(*lead, -1).sum(-1)
            values[spec.name] = c
        return values, log_det

    def unconstrain(self, values: dict[str, torch.Tensor]) -> torch.Tensor:
        """Inverse of :meth:`constrain`: ({name: [M, *shape]}) -> ``theta: [M, D]``."""
        parts = []
        for spec in self.specs:
            c = values[spec.name]
            block = self.slices[spec.name]
            if self.transforms[spec.name] is None:  # real: the identity
                u = c
            elif block.stop == block.start:  # nothing to move (a one-component simplex)
                u = c.new_zeros((c.shape[0], 0))
            elif self.lean[spec.name] == "positive":  # the inverse of _exp: log((c − 0)/1), the same bits
                u = c.log()
            else:
                u = spec.transform.inv(c)
            parts.append(u.reshape(c.shape[0], -1))
        return torch.cat(parts, dim=-1)


class Family(ABC):
    """A model family: hyperparameters fixed, parameters ``theta`` unknown.

    Subclasses set ``name`` and ``Params`` and implement :meth:`parameter_specs`,
    :meth:`observation_schema`, :meth:`validate`, :meth:`stacked_log_prior`,
    :meth:`stacked_log_likelihood` and :meth:`sample_prior_constrained`; :meth:`hyper` names the
    hyperparameters that may differ between stacked models.  Densities are written on stacked
    parameters ``[K, M, ...]`` (``K`` models, ``M`` particles) with plain tensor arithmetic: no
    ``torch.distributions`` objects or argument validation in the sampler's loop.
    """

    name: ClassVar[str]
    Params: ClassVar[type[HyperParams]]
    #: The prior written out in one line (the OpenAPI description of ``params``; docs/priors.md has the rest).
    prior: ClassVar[str] = ""
    #: Number of stream values a family conditions on before its first
    #: observation (the autoregressive order); 0 for i.i.d. families.
    context_size: int = 0

    def __init__(self, params: HyperParams | dict[str, Any] | None = None):
        if not isinstance(params, HyperParams):
            params = self.Params.model_validate(params or {})
        self.params = params
        self.space = ParameterSpace(self.parameter_specs())

    # ----- declared by each family ---------------------------------------------------------
    @abstractmethod
    def parameter_specs(self) -> list[ParameterSpec]:
        """The parameters with their constrained shapes and supports."""

    @abstractmethod
    def observation_schema(self) -> dict[str, Any]:
        """JSON-able schema of one observation.

        ``{"x": d | None, "y": [] | [d], "y_type": "real" | "label", "classes": K | None}``.
        """

    @abstractmethod
    def validate(self, x: Any, y: Any) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Check a block and return ``(x: [B, d] | None, y: [B] | [B, d])`` as float64 tensors.

        Raises
        ------
        ObservationError
            Naming the field, the row and the reason (shape, dtype, label range, NaN/inf).
        """

    def validate_stream(self, x: Any, y: Any) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Check a block as the stream stores it (the service's check of a posted chunk).

        Differs from :meth:`validate` only for a model that uses a subset of its stream's covariates
        (``params.features``): this returns every ``x`` column, :meth:`validate` the model's.
        """
        return self.validate(x, y)

    @abstractmethod
    def stacked_log_prior(self, values: dict[str, torch.Tensor], hp: dict[str, torch.Tensor]) -> torch.Tensor:
        """Log prior density of the constrained parameters of ``K`` models, ``[K, M]`` (nats).

        ``values``: ``{name: [K, M, *shape]}``; ``hp``: this family's :meth:`hyper` values as ``[K, 1]``
        tensors (one row per model of the stack; the rest of the hyperparameters are shared).
        """

    @abstractmethod
    def stacked_log_likelihood(
        self, values: dict[str, torch.Tensor], x: torch.Tensor | None, y: torch.Tensor, hp: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """Per-observation log-likelihood ``[K, M, B]`` (nats) of ``x: [K, B, d] | None``, ``y: [K, B, ...]``."""

    @abstractmethod
    def sample_prior_constrained(
        self, generator: torch.Generator, M: int, dtype: torch.dtype, device: torch.device
    ) -> dict[str, torch.Tensor]:
        """Draw ``M`` parameter sets from the prior, ``{name: [M, *shape]}``."""

    # ----- stacking ---------------------------------------------------------------------------
    def hyper(self) -> dict[str, float]:
        """Hyperparameters that may differ between the models of one stack (per-model ``[K, 1]`` tensors).

        Every other hyperparameter changes shapes or control flow and is part of :meth:`stack_key`.
        """
        return {}

    def stack_key(self) -> tuple[Any, ...]:
        """Families with equal keys evaluate together on stacked parameters ``[K, M, D]``."""
        hp = self.hyper()
        rest = {k: v for k, v in self.params.model_dump().items() if k not in hp}
        return (self.name, json.dumps(rest, sort_keys=True))

    def hyper_tensors(self, dtype: torch.dtype, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """:meth:`hyper` as ``[1, 1]`` tensors (a stack of one model)."""
        return {k: torch.tensor([[v]], dtype=dtype, device=device) for k, v in self.hyper().items()}

    #: True when the family implements :meth:`stacked_grad_log_likelihood` and :meth:`stacked_grad_log_prior`
    #: in closed form; the SGHMC gradient estimators then skip autograd.
    analytic_gradients: bool = False

    def stacked_grad_log_likelihood(
        self, theta: torch.Tensor, x: torch.Tensor | None, y: torch.Tensor, hp: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """``∇_θ Σ_b log p(y_b | x_b, θ_km)``: ``theta: [K, M, D]`` -> ``[K, M, D]``. Autograd unless overridden."""
        with torch.enable_grad():
            t = theta.detach().requires_grad_(True)
            values, _ = self.space.constrain(t)
            (g,) = torch.autograd.grad(self.stacked_log_likelihood(values, x, y, hp).sum(), t)
        return g

    #: True when the family implements :meth:`stacked_grad_weighted_log_likelihood`: an SGHMC step then evaluates its
    #: block's rows and its mini-batch's, at the particles and at the control variates' anchors, in one call
    #: (:func:`workers.gradients.potential_gradient`).
    weighted_gradients: bool = False

    def stacked_grad_weighted_log_likelihood(
        self,
        theta: torch.Tensor,
        x: torch.Tensor | None,
        y: torch.Tensor,
        weights: torch.Tensor,
        hp: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """``∇_θ Σ_b w_kpb log p(y_b | x_b, θ_kp)``: ``theta: [K, P, D]``, ``weights: [K, P, B]`` -> ``[K, P, D]``
        (``weighted_gradients`` families).  Raises ``NotImplementedError`` for the others."""
        raise NotImplementedError(f"{self.name} has no weighted likelihood gradient")

    def stacked_grad_log_prior(self, theta: torch.Tensor, hp: dict[str, torch.Tensor]) -> torch.Tensor:
        """``∇_θ log p(θ)`` (log-|J| included): ``theta: [K, M, D]`` -> ``[K, M, D]``. Autograd unless overridden."""
        with torch.enable_grad():
            t = theta.detach().requires_grad_(True)
            values, log_det = self.space.constrain(t)
            (g,) = torch.autograd.grad((self.stacked_log_prior(values, hp) + log_det).sum(), t)
        return g

    def stacked_prior_gradient(self, hp: dict[str, torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        """:meth:`stacked_grad_log_prior` as a function of ``theta: [K, M, D]`` alone, for a stack that calls it every
        SGHMC step (:meth:`models.stack.StackedFamily.grad_log_prior` makes it once per stack): a family whose prior
        gradient needs constants of ``hp`` forms them once here.  The same values as :meth:`stacked_grad_log_prior`."""
        return functools.partial(self.stacked_grad_log_prior, hp=hp)

    #: True when the family's log-likelihood is Gaussian and linear in θ (so ``Σ_b ∇ log p(y_b|θ) = c − θ A``)
    #: and its prior is Gaussian: the estimators then work with the statistics of a block or
    #: mini-batch (:meth:`stacked_gradient_statistics`, :meth:`stacked_prior_statistics`).
    quadratic: bool = False

    def stacked_gradient_statistics(
        self, x: torch.Tensor | None, y: torch.Tensor | None, hp: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, Any]:
        """``(A: [K, D, D], c: [K, D])`` with ``Σ_b ∇_θ log p(y_b|θ) = c − θ A`` (``quadratic`` families);
        ``y = None`` asks for ``A`` alone (``c`` None)."""
        raise NotImplementedError(f"{self.name} is not a quadratic family")

    def stacked_prior_statistics(self, hp: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A0: [K, D, D], c0: [K, D])`` with ``∇_θ log p(θ) = c0 − θ A0`` (``quadratic`` families)."""
        raise NotImplementedError(f"{self.name} is not a quadratic family")

    #: True when ``Σ_b ∇_θ log p(y_b|θ)`` and ``∇_θ log p(θ)`` are one function ``g(θ, T)`` LINEAR in additive
    #: sufficient statistics ``T`` (an exponential family whose conjugate prior acts as pseudo-observations):
    #: the sampler then folds the prior, the tempered block and a mini-batch into one ``T`` and makes ONE
    #: gradient evaluation per SGHMC step (:meth:`stacked_sufficient_statistics`,
    #: :meth:`stacked_prior_pseudo_statistics`, :meth:`stacked_grad_from_statistics`).
    sufficient_statistics: bool = False

    def stacked_sufficient_statistics(self, x: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
        """``T: [K, P]``, the sum over the rows ``x: [K, B, d] | None``, ``y: [K, B, ...]`` of the rows'
        sufficient statistics, so that ``Σ_b ∇_θ log p(y_b|θ) = g(θ, T)`` (``sufficient_statistics``
        families)."""
        raise NotImplementedError(f"{self.name} has no sufficient statistics")

    def stacked_prior_pseudo_statistics(self, hp: dict[str, torch.Tensor]) -> torch.Tensor:
        """``T0: [K, P]`` with ``∇_θ log p(θ) = g(θ, T0)`` (log-|J| included; ``sufficient_statistics``
        families)."""
        raise NotImplementedError(f"{self.name} has no sufficient statistics")

    def stacked_grad_from_statistics(self, theta: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
        """``g(θ, T)``: ``theta: [K, M, D]``, ``T: [K, P]`` -> ``[K, M, D]``, linear in ``T``
        (``sufficient_statistics`` families)."""
        raise NotImplementedError(f"{self.name} has no sufficient statistics")

    def stacked_statistics_steps(self, T: torch.Tensor) -> list[Any]:
        """The per-step statistics ``T: [K, S, P]`` of an SGHMC chain of ``S`` steps, prepared once for
        :meth:`stacked_grad_from_step` (``sufficient_statistics`` families): by default the views ``T[:, s]``.  A
        family may split them here into the pieces its gradient reads, so that a step does not slice them again."""
        return list(T.unbind(1))

    def stacked_grad_from_step(self, theta: torch.Tensor, step: Any) -> torch.Tensor:
        """``g(θ, T_s)`` for ``step``, an entry of :meth:`stacked_statistics_steps` (``theta: [K, M, D]`` ->
        ``[K, M, D]``): the same values as :meth:`stacked_grad_from_statistics` of ``T[:, s]``, bit for bit."""
        return self.stacked_grad_from_statistics(theta, step)

    def stacked_mode_from_statistics(self, T: torch.Tensor) -> torch.Tensor | None:
        """``θ̂: [K, D]``, the zero of :meth:`stacked_grad_from_statistics` ``g(θ, T)`` for ``T: [K, P]`` (prior
        pseudo-statistics plus data), where it has a closed form: the mode of a conjugate posterior in the unconstrained
        coordinates (``workers.conflict.laplace``); None where it has none (the default)."""
        return None

    #: True when, under the target whose statistics are ``T`` (``sufficient_statistics`` families), the LAST
    #: unconstrained coordinate is ``u = log σ²`` of a noise variance, the others given it are Gaussian
    #: (:meth:`stacked_coefficient_conditional`) and it given them is ``σ² ~ InvGamma(shape, scale(θ))``
    #: (:meth:`stacked_noise_conditional`): in the warm-up the sampler then moves by Gibbs sweeps on them instead of
    #: SGHMC steps (``workers.sgais.gibbs_sweep``).
    gibbs_conditionals: bool = False

    def stacked_noise_conditional(self, theta: torch.Tensor, T: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(shape: [K, 1], scale: [K, M])`` of ``σ² | θ ~ InvGamma(shape, scale)`` under the target of statistics
        ``T: [K, P]`` at the particles ``theta: [K, M, D]`` (``gibbs_conditionals`` families)."""
        raise NotImplementedError(f"{self.name} has no conditional noise variance")

    def stacked_coefficient_conditional(
        self, theta: torch.Tensor, T: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(mean: [K, M, D−1], L: [K, M, D−1, D−1], ok: [K, M])`` of the other coordinates given ``u``,
        ``N(mean, (L Lᵀ)⁻¹)``, under the target of statistics ``T: [K, P]`` at the particles ``theta: [K, M, D]``
        (``gibbs_conditionals`` families; ``ok`` false where the precision is not positive definite)."""
        raise NotImplementedError(f"{self.name} has no conditional coefficients")

    #: True when the tempered target whose statistics are ``T`` (``sufficient_statistics`` families) is a conjugate
    #: posterior the sampler can draw from exactly (:meth:`stacked_exact_draw`): in the warm-up it then moves by one
    #: such draw per annealing step instead of SGHMC steps (``workers.sgais.exact_draw``).
    exact_draws: bool = False

    def stacked_exact_draw_shapes(self, T: torch.Tensor) -> torch.Tensor:
        """``[K, G]``: the shapes of the ``G`` standard Gamma variates one exact draw of a particle takes under the
        target of statistics ``T: [K, P]`` (``exact_draws`` families)."""
        raise NotImplementedError(f"{self.name} has no exact draws")

    @property
    def exact_draw_normals(self) -> int:
        """The number of standard normal variates one exact draw of a particle takes (``exact_draws`` families)."""
        raise NotImplementedError(f"{self.name} has no exact draws")

    def stacked_exact_draw(self, T: torch.Tensor, log_gammas: torch.Tensor, normals: torch.Tensor) -> torch.Tensor:
        """``theta: [K, M, D]``, exact draws from the target of statistics ``T: [K, P]`` made of the logs of standard
        Gamma variates ``log_gammas: [K, M, G]`` (shapes :meth:`stacked_exact_draw_shapes`) and standard normals
        ``normals: [K, M, N]`` (``exact_draws`` families)."""
        raise NotImplementedError(f"{self.name} has no exact draws")

    def stacked_fisher(
        self, theta: torch.Tensor, weights: torch.Tensor, x: torch.Tensor | None, y: torch.Tensor, hp: dict
    ) -> torch.Tensor:
        """Exact empirical Fisher diagonal ``[K, D]`` (``quadratic`` families; see ``workers.fisher``)."""
        raise NotImplementedError(f"{self.name} has no exact Fisher diagonal")

    # ----- label symmetry -------------------------------------------------------------------------
    #: Largest number of label permutations :meth:`label_orbit` enumerates (6! = 720).
    MAX_LABEL_PERMUTATIONS: ClassVar[int] = 720

    def exchangeable_parameters(self) -> tuple[str, ...]:
        """The parameters whose leading axis indexes components that the prior and the likelihood treat
        alike (a mixture's labels): permuting that axis of all of them together changes neither, so the
        posterior has ``C!`` symmetric modes.  Empty (the default): no label symmetry."""
        return ()

    @property
    def unimodal(self) -> bool:
        """True when the log target of any data (log prior + log-likelihood, in the unconstrained coordinates)
        has one stationary point, whatever the data: log-concave targets and conjugate normal–inverse-gamma
        ones, whose joint posterior has a single mode in ``(mean, log σ²)``.  One Laplace start then finds the
        mode (:func:`workers.conflict.best_laplace`).  False (the default): the target may have several modes
        (mixtures, neural networks, and semi-conjugate priors, whose prior–data conflicts can make two), so the
        fit tries several starts."""
        return False

    @property
    def identifiable(self) -> bool:
        """True when distinct parameter values give distinct likelihoods (no mixture labels to switch, no hidden
        units to permute): a block posterior that its data concentrate is then one bump, which the Laplace
        approximation at its highest mode covers, so :func:`workers.conflict.defensive_start` starts from it
        whenever the prior draws do not already cover the block, not only on a prior–data conflict.  False (the
        default): a model with symmetric modes (a neural network's hidden units) keeps annealing from the prior,
        whose draws are symmetric, except on a conflict."""
        return False

    def label_orbit(self, theta: torch.Tensor) -> torch.Tensor | None:
        """``theta: [M, D]`` under every permutation of the exchangeable components: ``[P, M, D]``,
        ``P = C!``, the identity first.  None when the family has no label symmetry or
        ``C! > MAX_LABEL_PERMUTATIONS``.

        The components are permuted in the constrained parameters and mapped back (the simplex's
        stick-breaking coordinates change non-linearly).  A family's transforms must leave the log-|J| of
        :meth:`ParameterSpace.constrain` unchanged under the permutation (per-component transforms and the
        stick-breaking simplex do: ``tests/models/test_label_symmetry.py``), so that a permutation preserves
        volume in the unconstrained space too.
        """
        names = self.exchangeable_parameters()
        if not names:
            return None
        values, _ = self.space.constrain(theta)
        C, M = values[names[0]].shape[1], theta.shape[0]
        if math.factorial(C) > self.MAX_LABEL_PERMUTATIONS:
            return None
        perms = torch.tensor(list(itertools.permutations(range(C))), device=theta.device)  # [P, C]
        P = perms.shape[0]
        permuted = {}
        for name, v in values.items():
            if name in names:  # [M, C, ...] -> [P, M, C, ...] -> [P·M, C, ...]
                v = v[:, perms].movedim(1, 0)
            else:
                v = v[None].expand(P, *v.shape)
            permuted[name] = v.reshape(P * M, *v.shape[2:])
        return self.space.unconstrain(permuted).reshape(P, M, -1)

    # ----- one model (a stack of one) -----------------------------------------------------------
    @property
    def dim(self) -> int:
        """``D``, the length of the unconstrained parameter vector."""
        return self.space.dim

    def log_prior_constrained(self, values: dict[str, torch.Tensor]) -> torch.Tensor:
        """Log prior density of the constrained parameters ``{name: [M, *shape]}``, ``[M]`` (nats)."""
        v0 = next(iter(values.values()))
        hp = self.hyper_tensors(v0.dtype, v0.device)
        return self.stacked_log_prior({k: v[None] for k, v in values.items()}, hp)[0]

    def log_likelihood_constrained(
        self, values: dict[str, torch.Tensor], x: torch.Tensor | None, y: torch.Tensor
    ) -> torch.Tensor:
        """Per-observation log-likelihood ``[M, B]`` (nats)."""
        hp = self.hyper_tensors(y.dtype, y.device)
        xs = x[None] if x is not None else None
        return self.stacked_log_likelihood({k: v[None] for k, v in values.items()}, xs, y[None], hp)[0]

    def log_prior(self, theta: torch.Tensor) -> torch.Tensor:
        """Log prior density of unconstrained ``theta: [M, D]``, ``[M]`` (nats), log-|J| included."""
        values, log_det = self.space.constrain(theta)
        return self.log_prior_constrained(values) + log_det

    def log_likelihood(self, theta: torch.Tensor, x: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
        """``log p(y_b | x_b, theta_m)``: ``theta: [M, D]``, ``x: [B, d]``, ``y: [B, ...]`` -> ``[M, B]``."""
        values, _ = self.space.constrain(theta)
        return self.log_likelihood_constrained(values, x, y)

    def sample_prior(
        self,
        generator: torch.Generator,
        M: int,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        """``M`` prior draws as unconstrained ``theta: [M, D]``."""
        values = self.sample_prior_constrained(generator, M, dtype, torch.device(device))
        return self.space.unconstrain(values)

    @classmethod
    def sample_priors(
        cls,
        families: Sequence[Family],
        generators: Sequence[torch.Generator],
        M: int,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        """:meth:`sample_prior` of several models of this class, ``families[k]`` drawing from ``generators[k]``:
        ``theta: [K, M, D]``, each row the bits that model draws alone.  A family may override it to do the arithmetic
        once for the stack (:meth:`models.gmm.GaussianMixture.sample_priors`)."""
        return torch.stack([f.sample_prior(g, M, dtype, device) for f, g in zip(families, generators, strict=True)])

    def grad_log_likelihood(self, theta: torch.Tensor, x: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
        """``∇_θ Σ_b log p(y_b | x_b, θ_m)``: ``theta: [M, D]`` -> ``[M, D]``."""
        hp = self.hyper_tensors(theta.dtype, theta.device)
        xs = x[None] if x is not None else None
        return self.stacked_grad_log_likelihood(theta[None], xs, y[None], hp)[0]

    def grad_log_prior(self, theta: torch.Tensor) -> torch.Tensor:
        """``∇_θ log p(θ)`` (log-|J| included): ``theta: [M, D]`` -> ``[M, D]``."""
        return self.stacked_grad_log_prior(theta[None], self.hyper_tensors(theta.dtype, theta.device))[0]

    def prepare(
        self, x: torch.Tensor | None, y: torch.Tensor, context: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """Turn a validated block into the likelihood's ``(x, y)`` rows.

        I.i.d. families return the block unchanged.  Families with
        ``context_size > 0`` (autoregressive) build lagged covariates from the
        previous values of the stream, carried across blocks in ``context``;
        the stream's first ``context_size`` values are conditioned on and
        yield no rows.

        Returns
        -------
        (x_rows, y_rows, new_context)
        """
        return x, y, context

    def describe(self) -> dict[str, Any]:
        """Name, hyperparameters and parameter shapes, JSON-able."""
        return {
            "family": self.name,
            "params": self.params.model_dump(),
            "parameters": {s.name: list(s.shape) for s in self.space.specs},
            "dim": self.dim,
        }


# ----- validation helpers shared by the families ------------------------------------------


_NUMBERS = frozenset((float, int))


def _plain_numbers(values: Any) -> torch.Tensor | None:
    """Fast path: a JSON list (of lists) holding only ints and floats, as float64; None otherwise.

    ``torch.tensor`` parses nested lists in C; the type check (``bool`` is not a number here)
    runs over ``map(type, ...)``, also in C.  Anything unusual (ragged rows, strings, bools,
    overflow) returns None and the caller's row-by-row checks produce the error message.
    """
    if type(values) is not list:
        return None
    if values and type(values[0]) is list:
        if not all(type(row) is list for row in values):
            return None
        types = set(map(type, itertools.chain.from_iterable(values)))
    else:
        types = set(map(type, values))
    if not types <= _NUMBERS:
        return None
    try:
        return torch.tensor(values, dtype=torch.float64)
    except (ValueError, TypeError, RuntimeError, OverflowError):
        return None


def _rows_as_matrix(value: Any, field: str, columns: int | None) -> torch.Tensor:
    """The list-of-rows branch of :func:`as_matrix`: check each row's type and width, return ``[B, columns]``
    float64 (not yet checked for finiteness).

    Raises ObservationError naming the first bad row.
    """
    if not isinstance(value, (list, tuple)):
        raise ObservationError(field, "expected a list of rows")
    rows = []
    for i, row in enumerate(value):
        if isinstance(row, (int, float)) and not isinstance(row, bool) and columns == 1:
            row = [row]
        if not isinstance(row, (list, tuple)):
            raise ObservationError(field, "expected a list of numbers", row=i)
        if columns is not None and len(row) != columns:
            raise ObservationError(field, f"expected {columns} values, got {len(row)}", row=i)
        for v in row:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ObservationError(field, f"expected a number, got {type(v).__name__}", row=i)
        rows.append(row)
    if rows and columns is None:
        width = len(rows[0])
        for i, row in enumerate(rows):
            if len(row) != width:
                raise ObservationError(field, f"ragged rows: expected {width} values, got {len(row)}", row=i)
    return torch.tensor(rows, dtype=torch.float64) if rows else torch.zeros(0, columns or 0, dtype=torch.float64)


def as_matrix(value: Any, field: str, columns: int | None) -> torch.Tensor:
    """Validate a list of rows (or a tensor) as a finite float64 ``[B, columns]`` tensor.

    Raises ObservationError naming the first bad row.
    """
    fast = _plain_numbers(value)
    if fast is not None and fast.ndim == 2 and (columns is None or fast.shape[1] == columns):
        value = fast
    if isinstance(value, torch.Tensor):
        t = value.to(torch.float64)
        if t.ndim == 1 and columns == 1:
            t = t[:, None]
        if t.ndim != 2:
            raise ObservationError(field, f"expected a list of rows, got a tensor of shape {list(t.shape)}")
    else:
        t = _rows_as_matrix(value, field, columns)
    if columns is not None and t.shape[1] != columns:
        raise ObservationError(field, f"expected {columns} columns, got {t.shape[1]}")
    bad = ~torch.isfinite(t).all(dim=1)
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise ObservationError(field, "value is NaN or infinite", row=i)
    return t


def as_vector(value: Any, field: str) -> torch.Tensor:
    """Validate a list of numbers (or a tensor) as a finite float64 ``[B]`` tensor."""
    fast = _plain_numbers(value)
    if fast is not None and fast.ndim == 1:
        value = fast
    if isinstance(value, torch.Tensor):
        t = value.to(torch.float64)
        if t.ndim == 2 and t.shape[1] == 1:
            t = t[:, 0]
        if t.ndim != 1:
            raise ObservationError(field, f"expected a list of numbers, got a tensor of shape {list(t.shape)}")
    else:
        if not isinstance(value, (list, tuple)):
            raise ObservationError(field, "expected a list of numbers")
        for i, v in enumerate(value):
            if isinstance(v, (list, tuple)) and len(v) == 1:
                v = v[0]
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ObservationError(field, f"expected a number, got {type(v).__name__}", row=i)
        t = torch.tensor([v[0] if isinstance(v, (list, tuple)) else v for v in value], dtype=torch.float64)
    bad = ~torch.isfinite(t)
    if bad.any():
        raise ObservationError(field, "value is NaN or infinite", row=int(bad.nonzero()[0, 0]))
    return t


def check_nonempty_and_aligned(x: torch.Tensor | None, y: torch.Tensor) -> None:
    """Raise ObservationError for an empty block or ``x``/``y`` of different lengths."""
    if y.shape[0] == 0:
        raise ObservationError("y", "a chunk needs at least one observation")
    if x is not None and x.shape[0] != y.shape[0]:
        raise ObservationError("x", f"has {x.shape[0]} rows but y has {y.shape[0]} observations")


def require_no_x(x: Any, family: str) -> None:
    if x is not None:
        raise ObservationError("x", f"family {family!r} takes no covariates; omit x")


def require_x(x: Any, family: str) -> None:
    if x is None:
        raise ObservationError("x", f"family {family!r} needs covariates x, one row per observation")


def as_labels(value: Any, field: str, classes: int) -> torch.Tensor:
    """Validate class labels given as numbers: integer-valued, in ``0..classes-1``; float64 ``[B]``.

    Raises ObservationError naming the first bad row.
    """
    t = as_vector(value, field)
    bad = (t != torch.round(t)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise ObservationError(field, f"class label must be an integer, got {float(t[i])}", row=i)
    bad = ((t < 0) | (t > classes - 1)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise ObservationError(field, f"class label must be in 0..{classes - 1}, got {float(t[i]):g}", row=i)
    return t
