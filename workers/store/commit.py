"""The worker's Redis writes: the fenced commit scripts and their argument layout (DESIGN.md §2), lease
renewal and release.  The scripts themselves are ``workers/store/lua/*.lua`` (:mod:`workers.store.scripts`).

A chunk's results reach Redis in ONE round trip, ``lua/commit.lua``.  The script first checks
that the model's lease still holds the worker's token (fencing: a worker whose lease expired,
was taken over, or whose model was deleted writes nothing), then reads everything it needs,
then writes the checkpoint (state, cursor, counters, detector), the trace rows, the
block-latency histogram, the alerts and the ``evidence``/``alert`` events and renews the lease.
A script runs alone on the server and reaches the AOF as one ``MULTI/EXEC``, so the commit is
atomic: a chunk is applied iff the cursor moved past it together with the new state.  One script
call carries the commits of up to :data:`COMMITS_PER_SCRIPT` models (:meth:`Scripts.commit_many`),
run one after the other, each fenced by its own lease token; one that raises (before its first
write: its reads come first) writes nothing and the others still apply.

The stream posterior (model probabilities at the largest observation count every active model
of the stream has processed, API.md "Model comparison") is derived data.  The commit script
reads the stream's models and its leader record (``{"model", "observations"}``) and, only when
that common count differs from the record's, returns each active model's trace row at the
count.  The worker then computes the probabilities in Python (:mod:`workers.comparison`, the
code the API uses) and stores the new leader record, the ``posterior`` event and any
``model_switch`` alert with ``lua/leader.lua``: fenced by the same lease and compare-and-set on
the leader record (``stale`` = another worker moved it first: re-read with ``lua/stream.lua``
and recompute).  So one chunk costs one round trip, two when the common count moved.  A worker
killed between the two scripts leaves the leader record one step behind; the next commit on
the stream, or the next worker that restores one of its models, recomputes it from the
committed traces (the same values, so the same alert).

The scripts read the other models' keys by name (``P:T:ckpt:{m}`` ...), which a single Redis
server allows (Redis Cluster would not, nor does the rest of the key layout fit it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis

from workers.store.keys import BLOCK_SECONDS_BUCKETS, Keys, counter_field
from workers.store.scripts import (
    COMMIT_LUA,
    LEADER_LUA,
    RELEASE_LUA,
    RENEW_LUA,
    STREAM_LUA,
    Sent,
    send_calls,
)


@dataclass
class StreamState:
    """What ``lua/commit.lua`` / ``lua/stream.lua`` return when the common count moved.

    ``leader_raw`` is the leader record as stored (b"" when there is none), for the
    compare-and-set; ``models`` holds ``(name, observations, status, row, config)`` per model of
    the stream in name order, ``row`` the trace row JSON ending at ``count`` (b"" if none) and
    ``config`` the model config JSON (b"" when the caller said it knows the model's prior).
    """

    count: int
    leader_raw: bytes
    models: list[tuple[str, int, str, bytes, bytes]]

    @property
    def previous(self) -> dict[str, Any] | None:
        return json.loads(self.leader_raw) if self.leader_raw else None


def parse_state(reply: list) -> StreamState | None:
    """A script reply -> StreamState when it says ``moved``, else None."""
    if reply[0] != b"moved":
        return None
    count, leader, names, obs, status, rows, configs = reply[1:8]
    models = [
        (n.decode(), int(o), s.decode(), r, c) for n, o, s, r, c in zip(names, obs, status, rows, configs, strict=True)
    ]
    return StreamState(int(count), leader, models)


@dataclass
class SentCommits:
    """Commits written to Redis, replies not read yet (:meth:`Scripts.send_commits`): the models of each script
    call, in order, and the written calls (their connection, where the replies are read)."""

    models: list[list[str]]
    sent: Sent


#: Commits per ``lua/commit.lua`` call (:meth:`Scripts.commit_many`): enough to spread the client's cost of a
#: command over many commits, few enough that one call's arguments stay small (a command of megabytes costs
#: the client more per commit to pack) and that one call holds Redis briefly (other clients wait while it runs).
COMMITS_PER_SCRIPT = 16


class Scripts:
    """The worker's scripts registered on one Redis client (``EVALSHA``, reloaded after NOSCRIPT), with
    their KEYS/ARGV layout.  Every method is one round trip."""

    def __init__(self, r: redis.Redis, keys: Keys):
        self.r, self.keys = r, keys
        self._commit = r.register_script(COMMIT_LUA)
        self._stream = r.register_script(STREAM_LUA)
        self._leader = r.register_script(LEADER_LUA)
        self._renew = r.register_script(RENEW_LUA)
        self._release = r.register_script(RELEASE_LUA)

    def renew(self, leases: list[tuple[str, str, str]], ttl_ms: int) -> list[bool]:
        """Renew every lease ``(tenant, model, token)`` that still holds its token, for ``ttl_ms``, in one
        fenced script (``lua/renew.lua``); one flag per lease, False = lost (taken over, expired, deleted)."""
        if not leases:
            return []
        keys = [self.keys.lease(t, m) for t, m, _ in leases]
        return [bool(ok) for ok in self._renew(keys=keys, args=[ttl_ms, *(token for *_, token in leases)])]

    def count_loss(self, worker_id: str, tenant: str, model: str, retried_blocks: int) -> None:
        """Count a lease the worker lost on the model, and the blocks it had computed that the fence refused
        (they are redone by the next holder), in ``P:metrics:lease_losses`` / ``P:metrics:retried_blocks``."""
        field = counter_field(worker_id, tenant, model)
        pipe = self.r.pipeline(transaction=False)
        pipe.hincrby(self.keys.lease_losses, field, 1)
        if retried_blocks:
            pipe.hincrby(self.keys.retried_blocks, field, retried_blocks)
        pipe.execute()

    def release(self, tenant: str, model: str, token: str) -> None:
        """Delete the lease if it still holds ``token`` (``lua/release.lua``)."""
        self._release(keys=[self.keys.lease(tenant, model)], args=[token])

    def _query(self, tenant: str, known: str | int) -> list[Any]:
        """The stream query's arguments: the key prefixes of model configs, checkpoints and traces, then ``known`` (the
        known models' names comma-separated, or in ``lua/commit.lua`` the number of the call's list of them)."""
        k = self.keys
        return [k.model(tenant, ""), k.checkpoint(tenant, ""), k.trace(tenant, ""), known]

    def commit(self, **call: Any) -> StreamState | None:
        """Run ``lua/commit.lua`` for one model (the arguments of :meth:`commit_many`'s calls).

        Returns the stream's state when its common count moved (see :class:`StreamState`), else None.

        Raises
        ------
        LeaseLost
            The lease does not hold ``token``: nothing was written.
        """
        (reply,) = self.commit_many([call])
        if isinstance(reply, Exception):
            raise reply
        return reply

    def commit_many(self, calls: list[dict[str, Any]]) -> list[StreamState | None | Exception]:
        """Run the commits of ``calls`` in order, :data:`COMMITS_PER_SCRIPT` to a ``lua/commit.lua`` call, all in
        ONE round trip: each commit fenced by its own lease token and applied atomically, as one script per
        commit would.  A call's keyword arguments: ``tenant, model, stream, token, ttl_ms`` and ``checkpoint``
        (the checkpoint hash fields), the trace ``rows`` (scored by ``first_index``, each counted in the
        block-latency histogram by its ``seconds``), ``events`` as ``(chunks processed, evidence event head)``
        (:func:`workers.store.records.evidence_event_head`), ``alerts`` (full records), ``observations`` and
        ``known`` (the models of the stream whose config the caller has, comma-separated; None = no stream
        query): with it the stream's state is read as of that commit, the model at ``observations``.

        Returns, per call in order: the stream's state when its common count moved, None when it did not,
        or the exception of that call (:class:`LeaseLost`: nothing of it was written; a Redis error raised by
        its commit before its first write: nothing of it written; the error of its script call).  A connection
        failure raises (nothing is known of any call).
        """
        return self.commit_replies(self.send_commits(calls))

    def send_commits(self, calls: list[dict[str, Any]], after: SentCommits | None = None) -> SentCommits:
        """:meth:`commit_many`'s commits written to Redis without waiting for their replies: Redis runs them while the
        caller works on (the worker stages its next commits, or absorbs its next round), :meth:`commit_replies` reads
        them.  With ``after``, written on its connection after its commits and returned as one with them (their
        replies are read together).  A connection failure raises (nothing is known of any call)."""
        groups = [calls[i : i + COMMITS_PER_SCRIPT] for i in range(0, len(calls), COMMITS_PER_SCRIPT)]
        scripts = []
        for group in groups:
            keys: list[str] = []
            # each distinct list of known models once per script call (the commits of a stream share one: O(K) bytes
            # each, which every commit of a K-model stream carried, O(K²) a round), the commits refer to it by number
            known: dict[str, int] = {}
            body: list[Any] = []
            for call in group:
                call_keys, call_args = self._commit_call(**call, known_index=known)
                keys += call_keys
                body += [len(call_args), *call_args]
            scripts.append((keys, [len(group), len(known), *known, *body]))
        models = [[call["model"] for call in group] for group in groups]
        if after is None:
            return SentCommits(models, send_calls(self.r, self._commit, scripts))
        after.sent.send(scripts)
        after.models += models
        return after

    def commit_replies(self, sent: SentCommits) -> list[StreamState | None | Exception]:
        """The replies of :meth:`send_commits`' commits, per call in order, as :meth:`commit_many` returns them."""
        out: list[StreamState | None | Exception] = []
        for models, script_replies in zip(sent.models, sent.sent.replies(), strict=True):
            if isinstance(script_replies, Exception):  # the script call failed: no commit of it ran
                out += [script_replies] * len(models)
                continue
            for model, reply in zip(models, script_replies, strict=True):
                if reply[0] == b"lost":
                    out.append(LeaseLost(model))
                elif reply[0] == b"error":
                    out.append(redis.ResponseError(reply[1].decode(errors="replace")))
                else:
                    out.append(parse_state(reply))
        return out

    def _commit_call(
        self,
        *,
        tenant: str,
        model: str,
        stream: str,
        token: str,
        ttl_ms: int,
        checkpoint: dict[str, Any],
        rows: list[dict],
        events: list[tuple[int, str]],
        alerts: list[dict],
        observations: int,
        known: str | None,
        known_index: dict[str, int],
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of one commit of ``lua/commit.lua`` (layout in the file); ``known`` goes into the call's
        ``known_index`` (its list of known-model lists, numbered from 1), the commit's ARGV holds its number."""
        k, t = self.keys, tenant
        args: list[Any] = [token, ttl_ms, k.events(t, stream)]
        if known is not None:
            at = known_index.setdefault(known, len(known_index) + 1)
            args += [model, observations, *self._query(t, at)]
        else:
            args.append("")
        args.append(len(checkpoint))
        for name, value in checkpoint.items():
            args += [name, value]
        args.append(len(rows))
        for row in rows:
            args += [row["first_index"], json.dumps(row)]
        args.append(len(rows))
        for row in rows:
            le = next((b for b in BLOCK_SECONDS_BUCKETS if row["seconds"] <= b), None)
            args += ["" if le is None else str(le), repr(row["seconds"])]
        args.append(len(events))
        for chunks, head in events:
            args += [chunks, head]
        args.append(len(alerts))
        for a in alerts:
            args += [a["kind"], json.dumps(a), json.dumps({"type": "alert", **a}), repr(time.time() * 1000)]
        keys = [
            k.lease(t, model),
            k.checkpoint(t, model),
            k.trace(t, model),
            k.alerts(t),
            k.alerts_total,
            k.block_seconds,
            k.meta(t, stream),
            k.stream_models(t, stream),
            k.leader(t, stream),
            k.stream_obs(t, stream),
        ]
        return keys, args

    def stream_state(self, *, tenant: str, stream: str, known: str) -> StreamState | None:
        """Run ``lua/stream.lua``: the stream's state when its common count differs from the leader
        record's, else None.  Writes nothing."""
        k = self.keys
        return parse_state(
            self._stream(
                keys=[k.stream_models(tenant, stream), k.leader(tenant, stream)], args=self._query(tenant, known)
            )
        )

    def set_leader(
        self,
        *,
        tenant: str,
        model: str,
        stream: str,
        token: str,
        expected: bytes,
        record: dict[str, Any],
        posterior: dict[str, Any] | None,
        alert: dict[str, Any] | None,
    ) -> bool:
        """Run ``lua/leader.lua``: store the leader ``record``, publish the ``posterior`` event body (None =
        none) and store + publish the ``alert`` (None = none), if the leader record is still ``expected``
        (b"" = none).  False (nothing written) when it is not.

        Raises
        ------
        LeaseLost
            The lease does not hold ``token``: nothing was written.
        """
        k, t = self.keys, tenant
        res = self._leader(
            keys=[k.lease(t, model), k.leader(t, stream), k.alerts(t), k.alerts_total],
            args=[
                token,
                expected,
                json.dumps(record),
                k.events(t, stream),
                json.dumps({"type": "posterior", **posterior}) if posterior is not None else "",
                alert["kind"] if alert else "",
                json.dumps(alert) if alert else "",
                json.dumps({"type": "alert", **alert}) if alert else "",
                repr(time.time() * 1000),
            ],
        )
        if res == b"lost":
            raise LeaseLost(model)
        return res == b"ok"


class LeaseLost(Exception):
    """Our lease on a model expired, was taken over, or the model was deleted.  ``blocks``: the blocks the
    worker had computed for the refused commit (redone by the next holder)."""

    def __init__(self, model: str, *, blocks: int = 0):
        super().__init__(model)
        self.blocks = blocks
