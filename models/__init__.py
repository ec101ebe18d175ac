"""Model families: what a model IS (DESIGN.md §4)."""

from __future__ import annotations

from typing import Any

from models.base import Family, HyperParams, ObservationError, ParameterSpec, ParameterSpace
from models.linear_regression import LinearRegression

FAMILIES: dict[str, type[Family]] = {
    LinearRegression.name: LinearRegression,
}

try:  # families added by their own modules register here
    from models.logistic_regression import LogisticRegression

    FAMILIES[LogisticRegression.name] = LogisticRegression
except ImportError:  # pragma: no cover - during development only
    pass
try:
    from models.gmm import GaussianMixture

    FAMILIES[GaussianMixture.name] = GaussianMixture
except ImportError:  # pragma: no cover
    pass
try:
    from models.autoregressive import Autoregressive

    FAMILIES[Autoregressive.name] = Autoregressive
except ImportError:  # pragma: no cover
    pass
try:
    from models.bnn import BayesianNeuralNetwork

    FAMILIES[BayesianNeuralNetwork.name] = BayesianNeuralNetwork
except ImportError:  # pragma: no cover
    pass


class UnknownFamilyError(KeyError):
    pass


def make_family(name: str, params: dict[str, Any] | None = None) -> Family:
    """Instantiate a family by name.

    Raises
    ------
    UnknownFamilyError
        If ``name`` is not a registered family.
    pydantic.ValidationError
        If ``params`` do not match the family's hyperparameter schema.
    """
    try:
        cls = FAMILIES[name]
    except KeyError:
        raise UnknownFamilyError(name) from None
    return cls(params)


__all__ = [
    "FAMILIES", "Family", "HyperParams", "ObservationError", "ParameterSpec", "ParameterSpace",
    "UnknownFamilyError", "make_family",
]
