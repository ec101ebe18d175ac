"""Model families: what a model IS (DESIGN.md §4)."""

from __future__ import annotations

from typing import Any

from models.autoregressive import Autoregressive
from models.base import Family, HyperParams, ObservationError, ParameterSpace, ParameterSpec
from models.bnn import BayesianNeuralNetwork
from models.gmm import GaussianMixture
from models.linear_regression import LinearRegression
from models.logistic_regression import LogisticRegression

FAMILIES: dict[str, type[Family]] = {
    cls.name: cls
    for cls in (LinearRegression, LogisticRegression, GaussianMixture, Autoregressive, BayesianNeuralNetwork)
}


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
    "FAMILIES",
    "Family",
    "HyperParams",
    "ObservationError",
    "ParameterSpec",
    "ParameterSpace",
    "UnknownFamilyError",
    "make_family",
]
