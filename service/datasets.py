"""The seven change-point series that ship with river (``river.drift.datasets``), as TCPDBench uses them.

River ships the raw CSVs of the Turing Change Point Dataset (van den Burg & Williams 2020); two
of them are subsampled here the way TCPD builds its series (its ``get_apple.py``: skip the first
row, keep every 3rd, columns Close and Volume; ``brent_spot/convert.py``: every 10th day, from the
first day of 2000), so the human annotations line up with the indices.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass

import numpy as np

SERIES = ["AirlinePassengers", "Apple", "Bitcoin", "BrentSpotPrice", "Occupancy", "RunLog", "UKCoalEmploy"]

_COLUMNS = {
    "AirlinePassengers": ["Total Passengers"],
    "Apple": ["Close", "Volume"],
    "Bitcoin": ["price"],
    "BrentSpotPrice": ["DPB"],
    "Occupancy": ["V1", "V2", "V3", "V4"],
    "RunLog": ["Pace", "Distance"],
    "UKCoalEmploy": ["Employment"],
}


@dataclass
class Series:
    """One series: ``values`` [T, d] (raw units), ``annotations`` {annotator: [0-based indices]}."""

    name: str
    columns: list[str]
    values: np.ndarray
    annotations: dict[str, list[int]]

    @property
    def n(self) -> int:
        return int(self.values.shape[0])

    def standardised(self) -> np.ndarray:
        """Each column shifted and scaled to mean 0, std 1 over the whole series: [T, d]."""
        sd = self.values.std(0)
        return (self.values - self.values.mean(0)) / np.where(sd > 0, sd, 1.0)


def load_series(name: str) -> Series:
    """Load one of :data:`SERIES`. Raises ``KeyError`` for an unknown name."""
    import river.drift.datasets as D

    ds = getattr(D, name)()
    cols = _COLUMNS[name]
    with open(ds.path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    if name == "Apple":
        rows = rows[1:][::3]
    elif name == "BrentSpotPrice":
        rows = rows[::10]
        first = next(i for i, r in enumerate(rows) if r["day"].endswith("2000"))
        rows = rows[first:]
    values = np.array([[float(r[c]) for c in cols] for r in rows], dtype=np.float64)
    return Series(name, cols, values, {k: list(v) for k, v in ds.annotations.items()})
