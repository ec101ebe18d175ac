"""The history ``H`` of earlier observations that mini-batches are drawn from.

Exact by default (every row kept, in an amortised-doubling buffer so appending a
block costs O(|C|)).  With a ``capacity`` it is a uniform reservoir (Vitter's
Algorithm R) whose replacement draws come from its own generator seeded from the
model's seed, so replaying the stream log through a fresh reservoir rebuilds it
bit for bit (that is how a restored worker rebuilds it, DESIGN.md §2).
"""

from __future__ import annotations

import torch


class History:
    """Append-only store of likelihood rows ``(x: [n, d] | None, y: [n, ...])``.

    Attributes
    ----------
    seen : int
        Rows ever appended (``n_prev`` of the next block).
    size : int
        Rows held (``min(seen, capacity)``).
    """

    def __init__(
        self,
        *,
        capacity: int | None = None,
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
    ):
        self.capacity = capacity
        self.dtype = dtype
        self.device = torch.device(device)
        self.x: torch.Tensor | None = None
        self.y: torch.Tensor | None = None
        self.has_x = False
        self.size = 0
        self.seen = 0
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed((seed * 2654435761 + 97) % (2**63))
        # (family type, rows summed, their summed sufficient statistics): workers.sgais._history_statistics
        self._statistics: tuple[type, int, torch.Tensor] | None = None

    def _ensure(self, x: torch.Tensor | None, y: torch.Tensor, extra: int) -> None:
        need = self.size + extra
        if self.capacity is not None:
            need = min(need, self.capacity)
        if self.y is None:
            cap = max(need, 1024) if self.capacity is None else self.capacity
            self.has_x = x is not None
            self.y = torch.empty((cap, *y.shape[1:]), dtype=self.dtype, device=self.device)
            self.x = torch.empty((cap, x.shape[1]), dtype=self.dtype, device=self.device) if x is not None else None
            return
        if need > self.y.shape[0]:
            cap = max(need, 2 * self.y.shape[0])
            y_new = torch.empty((cap, *self.y.shape[1:]), dtype=self.dtype, device=self.device)
            y_new[: self.size] = self.y[: self.size]
            self.y = y_new
            if self.x is not None:
                x_new = torch.empty((cap, self.x.shape[1]), dtype=self.dtype, device=self.device)
                x_new[: self.size] = self.x[: self.size]
                self.x = x_new

    def append(self, x: torch.Tensor | None, y: torch.Tensor) -> None:
        """Add a block of rows ``x: [B, d] | None``, ``y: [B, ...]``."""
        B = y.shape[0]
        if B == 0:
            return
        if self.capacity is not None or self.y is None or self.size + B > self.y.shape[0]:  # else room already
            self._ensure(x, y, B)
        buf_x, buf_y = self.x, self.y
        assert buf_y is not None  # allocated by _ensure
        take = B if self.capacity is None else max(0, min(B, self.capacity - self.size))
        if take:  # copy_ converts the dtype (a block's rows, every block of every population: no __setitem__)
            buf_y[self.size : self.size + take].copy_(y if take == B else y[:take])
            if buf_x is not None:
                assert x is not None  # a history with covariates gets blocks with covariates
                buf_x[self.size : self.size + take].copy_(x if take == B else x[:take])
            self.size += take
            self.seen += take
        # Algorithm R for the rest: row with global index t replaces slot j ~ U{0..t} if j < capacity.
        for i in range(take, B):
            assert self.capacity is not None  # take < B only for a bounded reservoir
            j = int(torch.randint(0, self.seen + 1, (), generator=self.generator, device=self.device))
            self.seen += 1
            if j < self.capacity:
                buf_y[j] = y[i]
                if buf_x is not None:
                    assert x is not None
                    buf_x[j] = x[i]

    def statistics_of(self, kind: type) -> tuple[int, torch.Tensor] | None:
        """``(r, T)``: the summed sufficient statistics ``T: [P]`` of the first ``r`` held rows, as a family of type
        ``kind`` last kept them (:meth:`keep_statistics`), or None; valid while every row seen is held (an exact
        history) and none was forgotten since (:meth:`truncate`, :meth:`load_state_tensors` drop them)."""
        kept = self._statistics
        if kept is None or kept[0] is not kind or self.size != self.seen or kept[1] > self.size:
            return None
        return kept[1], kept[2]

    def keep_statistics(self, kind: type, rows: int, total: torch.Tensor) -> None:
        """Keep ``total``, the summed sufficient statistics of the first ``rows`` held rows (:meth:`statistics_of`)."""
        self._statistics = (kind, rows, total) if self.size == self.seen else None

    def truncate(self, seen: int) -> None:
        """Forget the rows appended after the first ``seen`` (undo of :meth:`append`).

        Raises ValueError for a reservoir that has started replacing rows (those cannot be undone).
        """
        if self.size != self.seen or not 0 <= seen <= self.seen:
            raise ValueError(f"cannot truncate a history of {self.seen} rows ({self.size} held) to {seen}")
        self.size = self.seen = seen
        self._statistics = None

    def rows(self, index: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Rows at ``index: [B]`` (int64, each in ``[0, size)``).

        Raises ValueError for an empty history.
        """
        if self.y is None:
            raise ValueError("history is empty")
        return (self.x[index] if self.x is not None else None), self.y[index]

    def all_rows(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Views of every held row."""
        if self.y is None:
            raise ValueError("history is empty")
        return (self.x[: self.size] if self.x is not None else None), self.y[: self.size]

    def sample_index(self, generator: torch.Generator, batch_size: int) -> torch.Tensor:
        """``batch_size`` indices drawn uniformly with replacement (thesis eq. 4.14)."""
        return torch.randint(0, self.size, (batch_size,), generator=generator, device=self.device)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Tensors that restore the history exactly (held rows + reservoir RNG)."""
        out = {"history.generator": self.generator.get_state()}
        if self.y is not None:
            out["history.y"] = self.y[: self.size].contiguous()
            if self.x is not None:
                out["history.x"] = self.x[: self.size].contiguous()
        return out

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], seen: int) -> None:
        self._statistics = None
        self.generator.set_state(tensors["history.generator"])
        self.seen = seen
        if "history.y" in tensors:
            y = tensors["history.y"].to(self.device)
            x = tensors.get("history.x")
            self.y = None
            self.size = 0
            self._ensure(x, y, y.shape[0])
            buf_x, buf_y = self.x, self.y
            assert buf_y is not None  # allocated by _ensure
            buf_y[: y.shape[0]] = y
            if x is not None:
                assert buf_x is not None  # allocated by _ensure for a history with covariates
                buf_x[: x.shape[0]] = x.to(self.device)
            self.size = y.shape[0]


class StackBatches:
    """Mini-batches for a stack of models, each drawn from its own history with its own generator.

    Model ``k`` draws its indices uniformly with replacement from its held rows (thesis eq. 4.14)
    with ``generators[k]``, all the batches of one annealing step in one call (:meth:`plan`); a model
    with an empty history draws nothing and gets row 0 of the stack (its history term carries weight
    ``n_prev = 0``).  With several models the held rows are concatenated once per block
    (``O(Σ n_k)`` copies) so that a step gathers every model's batch in one indexing operation;
    one model indexes its own buffer directly.
    """

    def __init__(self, histories: list[History], batch_size: int):
        self.histories = histories
        self.batch_size = batch_size
        self.sizes = [h.size for h in histories]
        self._source: tuple[torch.Tensor | None, torch.Tensor, list[int]] | None = None

    def source(self) -> tuple[torch.Tensor | None, torch.Tensor, list[int]]:
        """``(x: [N, d] | None, y: [N, ...], offsets)``: the rows the indices of :meth:`plan` point into."""
        if self._source is None:
            if len(self.histories) == 1:
                x, y = self.histories[0].all_rows()
                self._source = (x, y, [0])
            else:
                held = [h for h in self.histories if h.size > 0]
                xs = [h.x[: h.size] for h in held if h.x is not None]
                offsets, start = [], 0
                for size in self.sizes:
                    offsets.append(start)
                    start += size
                ys = [h.y[: h.size] for h in held if h.y is not None]
                self._source = (torch.cat(xs) if xs else None, torch.cat(ys), offsets)
        return self._source

    def plan(self, generators: list[torch.Generator], models: list[int], counts: list[int]) -> torch.Tensor:
        """Indices ``[k, max(counts), batch_size]`` into :meth:`source`: model ``models[j]`` draws
        ``counts[j]`` batches with ``generators[j]`` (one ``randint`` call); the rest is zeros."""
        _, y, offsets = self.source()
        S, B = max(counts, default=0), self.batch_size
        out = torch.zeros((len(models), S, B), dtype=torch.long, device=y.device)
        for j, (g, k, c) in enumerate(zip(generators, models, counts, strict=True)):
            if c and self.sizes[k]:
                rows = out[j, :c]  # drawn in place: the same draws as a fresh tensor of that shape
                rows.random_(0, self.sizes[k], generator=g)  # torch.randint's draws (empty().random_())
                if offsets[k]:
                    rows += offsets[k]
        return out

    def rows(self, index: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The rows at ``index`` (any shape): ``(x: [*index.shape, d] | None, y: [*index.shape, ...])``."""
        x, y, _ = self.source()
        return (x[index] if x is not None else None), y[index]
