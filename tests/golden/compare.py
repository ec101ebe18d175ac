"""How golden records are compared: bit for bit on the machine kind they were recorded on, to a tight relative
tolerance elsewhere.

Why two modes.  The numerics are deterministic for a given machine kind, but not across CPUs: MKL and
PyTorch's CPU kernels pick code paths by instruction set (AVX2, AVX-512) and vendor, and sum in other orders
there.  Measured: the goldens recorded on an Intel machine differed from an AMD EPYC's values in the last
bits only (relative 3e-16 to 1.4e-14, every block, every family; no count, step or resampling decision
differed).  CI runs on whatever machine the session had, so an exact comparison there would fail for no
fault of the code.  Elsewhere, floats are compared to ``REL_TOL`` = 1e-9: ten thousand times the largest
cross-machine difference seen, while any change to the arithmetic itself (one more random draw, a changed
step size or weight) moves the log-evidence by far more than 1e-9 relative (1e-3 nats or more in every
case tried).  Integers, booleans and strings (counts, steps, flags) are compared exactly in both modes, so
a flipped discrete decision fails either way; checkpoint hashes are compared only in the exact mode, and
the checkpoints' tensor sums (recorded beside them) to the tolerance elsewhere.
"""

from __future__ import annotations

import math
import platform
from typing import Any

import torch

REL_TOL = 1e-9
ABS_TOL = 1e-9


def machine() -> dict[str, Any]:
    """The machine kind the bits depend on: torch version, CPU capability and model, thread count."""
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), model)
    except OSError:
        pass
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": model,
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
    }


def mismatches(got: Any, want: Any, *, exact: bool, path: str = "") -> list[str]:
    """Where ``got`` differs from ``want`` (JSON values): every difference when ``exact``, else floats beyond
    the tolerance, any other value that differs, and no ``sha256`` keys (see the module docstring)."""
    if isinstance(want, dict) and isinstance(got, dict):
        keys = set(want) | set(got)
        if not exact:
            keys.discard("sha256")
        out: list[str] = []
        for k in sorted(keys):
            if k not in got or k not in want:
                out.append(f"{path}/{k}: only in {'golden' if k in want else 'result'}")
            else:
                out += mismatches(got[k], want[k], exact=exact, path=f"{path}/{k}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path}: {len(got)} items, golden {len(want)}"]
        return [
            m
            for i, (g, w) in enumerate(zip(got, want, strict=True))
            for m in mismatches(g, w, exact=exact, path=f"{path}[{i}]")
        ]
    both_float = isinstance(want, float) and isinstance(got, float)
    if both_float and not exact:
        same = math.isclose(got, want, rel_tol=REL_TOL, abs_tol=ABS_TOL) or (math.isnan(got) and math.isnan(want))
    else:
        same = type(got) is type(want) and got == want
    return [] if same else [f"{path}: {got!r} != golden {want!r}"]


def check(got: Any, want: Any, recorded_on: dict[str, Any] | None) -> None:
    """Assert ``got`` matches the golden ``want`` (bit for bit iff this machine is the one it was recorded on).

    Raises
    ------
    AssertionError
        Listing the first differences and the mode.
    """
    exact = recorded_on == machine()
    diffs = mismatches(got, want, exact=exact)
    mode = "bit for bit (same machine kind)" if exact else f"to relative {REL_TOL:g} (recorded on {recorded_on})"
    assert not diffs, f"{len(diffs)} differences, compared {mode}:\n" + "\n".join(diffs[:20])
