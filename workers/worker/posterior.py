"""The stream posterior after a commit (API.md "Model comparison"): model probabilities at the stream's
common observation count, the leader record and ``model_switch`` alerts, stored with the fenced
compare-and-set ``lua/leader.lua`` (:meth:`workers.store.commit.Scripts.set_leader`)."""

from __future__ import annotations

import json
from typing import Any

from workers import comparison
from workers.store import records
from workers.store.commit import Scripts, StreamState
from workers.worker.detect import alert_record
from workers.worker.leases import Held

#: ``(status, error)`` as a commit stored them in the checkpoint (``"ok"`` or ``"degraded"``; the reason or None)
CommittedStatus = tuple[str, str | None]


class StreamPosteriors:
    """Computes and stores stream posteriors; caches the models' configs (immutable while a model
    exists, so each is read once; a model deleted and re-created under the same name keeps its old config
    here until the worker restarts)."""

    def __init__(self, scripts: Scripts):
        self.scripts = scripts
        # (tenant, stream) -> model -> config: a stream's models found without scanning every stream's (a
        # commit asks for them, so a scan made a round of K models on one stream cost O(K²))
        self._configs: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        self._known: dict[tuple[str, str], str] = {}  # the names of _configs[stream], comma-separated
        # (tenant, model) -> (config, its comparison.model_context): 5 µs a model and posterior otherwise
        self._contexts: dict[tuple[str, str], tuple[dict[str, Any], int]] = {}

    def known(self, h: Held) -> str:
        """Models of ``h``'s stream whose config is cached, comma-separated (the scripts skip reading their
        configs); built once per change of the cache (every commit sends it)."""
        key = (h.tenant, h.stream)
        cached = self._configs.get(key, {})
        if h.name not in cached:
            return ",".join([*cached, h.name])
        known = self._known.get(key)
        if known is None:
            known = self._known[key] = ",".join(cached)
        return known

    def state(self, h: Held) -> StreamState | None:
        """The stream's state when its common count differs from the leader record's (else None)."""
        return self.scripts.stream_state(tenant=h.tenant, stream=h.stream, known=self.known(h))

    def _context(self, tenant: str, model: str, cfg: dict[str, Any]) -> int:
        """:func:`workers.comparison.model_context` of ``cfg``, computed once per config object."""
        got = self._contexts.get((tenant, model))
        if got is None or got[0] is not cfg:
            got = self._contexts[(tenant, model)] = (cfg, comparison.model_context(cfg))
        return got[1]

    def update(
        self,
        h: Held,
        state: StreamState | None,
        rows: list[dict[str, Any]],
        *,
        status: CommittedStatus | None = None,
    ) -> None:
        """Store the stream posterior of ``state`` (leader record, ``posterior`` event, ``model_switch``
        alert); re-read and recompute while another worker moved the leader record first.  ``rows``: this
        model's rows just committed (the commit script read the stream before writing them); ``status``: the
        ``(status, error)`` that commit stored (None: the engine's current one).  Nothing to do when ``state`` is
        None.

        Raises
        ------
        LeaseLost
            The lease no longer holds our token (nothing written).
        """
        while state is not None:
            posterior, record, switch = self.compute(h, state, rows, status=status)
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

    def _model_states(
        self, h: Held, state: StreamState, rows: list[dict[str, Any]], own: CommittedStatus | None = None
    ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any] | None]]:
        """Each model's :func:`workers.store.records.model_state` (with the reason of a failed or degraded model, as
        ``GET /v1/streams/{stream}/posterior`` gives it) and its trace row ending at ``state.count`` (or None)."""
        t, count = h.tenant, state.count
        names = {m for m, *_ in state.models}
        cached = self._configs.setdefault((t, h.stream), {})
        self._known.pop((t, h.stream), None)
        for m in [m for m in cached if m not in names]:
            del cached[m]
            self._contexts.pop((t, m), None)
        states, rows_n = {}, {}
        for m, obs, status, raw_row, cfg in state.models:
            if cfg:
                cached[m] = json.loads(cfg)
            conf = h.cfg if m == h.name else cached[m]
            states[m] = records.model_state(conf, obs, status, None, context=self._context(t, m, conf))
            rows_n[m] = records.trace_row_at([raw_row], count) if raw_row else None
        # the script read h's status before this commit wrote it: the status the commit stored, else the engine's
        # (not while a restored engine is still behind its cursor, re-absorbing: the stored status is then the newer)
        if h.name in states and own is not None:
            states[h.name].update(status=own[0], error=own[1])
        elif h.name in states and h.engine is not None and h.replay_from is None:
            reason = getattr(h.engine, "degraded", None)
            states[h.name].update(status="degraded" if reason else "ok", error=reason or None)
        for row in rows:
            if row["observations"] == count:
                rows_n[h.name] = row
        flagged = [m for m in states if states[m]["status"] in ("error", "degraded") and m != h.name]
        if flagged:
            pipe = self.scripts.r.pipeline(transaction=False)
            for m in flagged:
                pipe.hget(self.scripts.keys.checkpoint(t, m), "error")
            for m, err in zip(flagged, pipe.execute(), strict=True):
                states[m]["error"] = err.decode() if err else None
        return states, rows_n

    def compute(
        self, h: Held, state: StreamState, rows: list[dict[str, Any]], status: CommittedStatus | None = None
    ) -> tuple[dict[str, Any] | None, dict[str, Any], dict[str, Any] | None]:
        """Stream posterior at ``state.count``: (event body, or None if the count went down; leader record;
        ``model_switch`` alert or None).  ``rows``: this model's rows not yet in ``state`` (see above).
        The body is :func:`workers.store.records.stream_posterior`, as the API computes it (every model scored
        on the observations after the stream's largest context, ``conditioned_on``); the leader changes by
        :func:`workers.comparison.switch_leader` (margin and hysteresis)."""
        t, count = h.tenant, state.count
        r, keys = self.scripts.r, self.scripts.keys
        states, rows_n = self._model_states(h, state, rows, status)
        scored = [m for m in states if states[m]["status"] != "error" and rows_n.get(m) is not None]
        conditioned_on = comparison.stream_context([st["context"] for st in states.values()])
        rows_c: dict[str, dict | None] = {}
        while 0 < conditioned_on < count and scored:  # the same search as workers.store.reads.stream_posterior
            pipe = r.pipeline(transaction=False)
            for m in scored:
                pipe.zrevrangebyscore(keys.trace(t, m), conditioned_on - 1, "-inf", start=0, num=1)
            rows_c = {
                m: records.row_covering(got, conditioned_on) for m, got in zip(scored, pipe.execute(), strict=True)
            }
            ends = {m: (x or {}).get("observations") for m, x in rows_c.items()}
            nxt = comparison.next_common_count(conditioned_on, ends)
            if nxt == conditioned_on:
                break
            conditioned_on = count if nxt is None else nxt
        entries = records.posterior_entries(states, rows_n, rows_c)
        posterior = records.stream_posterior(h.stream, count, conditioned_on, entries)
        previous = state.previous
        if previous is not None and count < previous["observations"]:
            # a model joined the stream: the count went down; the leader stays
            return None, {"model": previous["model"], "observations": count}, None
        old = previous["model"] if previous is not None and previous["model"] in states else None
        new_leader, switch = comparison.switch_leader(old, posterior["models"])
        if switch is not None and previous is not None:  # a switch needs a previous leader
            switch.update(stream=h.stream, observation_index=previous["observations"], detected_at_index=count - 1)
        return posterior, {"model": new_leader, "observations": count}, switch
