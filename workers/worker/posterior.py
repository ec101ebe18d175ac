"""The stream posterior after a commit (API.md "Model comparison"): model probabilities at the stream's
common observation count, the leader record and ``model_switch`` alerts, stored with the fenced
compare-and-set ``lua/leader.lua`` (:meth:`workers.store.commit.Scripts.set_leader`)."""

from __future__ import annotations

import json
from typing import Any

from workers import alerts as detector_lib
from workers.comparison import leader as leader_of
from workers.store import records
from workers.store.commit import Scripts, StreamState
from workers.worker.detect import alert_record
from workers.worker.leases import Held


class StreamPosteriors:
    """Computes and stores stream posteriors; caches the models' priors (configs are immutable while a
    model exists, so each prior is read once; a model deleted and re-created under the same name keeps
    its old prior here until the worker restarts)."""

    def __init__(self, scripts: Scripts):
        self.scripts = scripts
        self._priors: dict[tuple[str, str, str], float] = {}  # (tenant, stream, model) -> prior_probability

    def known(self, h: Held) -> list[str]:
        """Models of ``h``'s stream whose prior is cached (the scripts skip reading their configs)."""
        return sorted({m for (t, s, m) in self._priors if (t, s) == (h.tenant, h.stream)} | {h.name})

    def state(self, h: Held) -> StreamState | None:
        """The stream's state when its common count differs from the leader record's (else None)."""
        return self.scripts.stream_state(tenant=h.tenant, stream=h.stream, known=self.known(h))

    def update(self, h: Held, state: StreamState | None, rows: list[dict[str, Any]]) -> None:
        """Store the stream posterior of ``state`` (leader record, ``posterior`` event, ``model_switch``
        alert); re-read and recompute while another worker moved the leader record first.  ``rows``: this
        model's rows just committed (the commit script read the stream before writing them).  Nothing to
        do when ``state`` is None.

        Raises
        ------
        LeaseLost
            The lease no longer holds our token (nothing written).
        """
        while state is not None:
            posterior, record, switch = self.compute(h, state, rows)
            if self.scripts.set_leader(
                tenant=h.tenant,
                model=h.name,
                stream=h.stream,
                token=h.token,
                expected=state.leader_raw,
                record=record,
                posterior=posterior,
                alert=alert_record(switch) if switch is not None else None,
            ):
                return
            state = self.state(h)  # another worker moved the leader record first: re-read

    def compute(
        self, h: Held, state: StreamState, rows: list[dict[str, Any]]
    ) -> tuple[dict[str, Any] | None, dict[str, Any], dict[str, Any] | None]:
        """Stream posterior at ``state.count``: (event body, or None if the count went down; leader record;
        ``model_switch`` alert or None).  ``rows``: this model's rows not yet in ``state`` (see above)."""
        t, count = h.tenant, state.count
        names = {m for m, *_ in state.models}
        for key in [key for key in self._priors if key[:2] == (t, h.stream) and key[2] not in names]:
            del self._priors[key]
        states, priors, lz = {}, {}, {}
        for m, obs, status, row, cfg in state.models:
            if cfg:
                self._priors[(t, h.stream, m)] = json.loads(cfg)["prior_probability"]
            priors[m] = h.cfg["prior_probability"] if m == h.name else self._priors[(t, h.stream, m)]
            states[m] = {"observations": obs, "status": status}
            if row and (found := records.trace_row_at([row], count)) is not None:
                lz[m] = found["log_evidence"]
        for r in rows:
            if r["observations"] == count:
                lz[h.name] = r["log_evidence"]
        active = [m for m in states if states[m]["status"] != "error"]
        if count == 0:
            lz = {m: 0.0 for m in active}
        entries = [{"model": m, "prior_probability": priors[m], "log_evidence": lz[m]} for m in active if m in lz]
        posterior = records.stream_posterior(h.stream, count, entries)
        record = {"model": leader_of(posterior["models"]), "observations": count}
        previous = state.previous
        if previous is not None and count < previous["observations"]:
            return None, record, None  # a model joined the stream: the count went down
        switch = None
        if previous is not None and previous["model"] in states:
            switch = detector_lib.model_switch(previous["model"], posterior["models"])
            if switch is not None:
                switch.update(stream=h.stream, observation_index=previous["observations"], detected_at_index=count - 1)
        return posterior, record, switch
