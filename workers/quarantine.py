"""Quarantine and block budget: no model can kill, stall or starve a worker (issue 11).

Two mechanisms, both per model, both keeping the committed state and exactly-once intact:

**Attempt accounting (quarantine).**  Before a worker starts work that may fail on a model (restoring
or creating its engine; absorbing a batch of chunks, the first after cursor ``C``) it records an
*attempt* at ``C`` in the Redis hash ``P:T:attempts:{m}`` with one fenced script (:data:`BEGIN_LUA`:
nothing is written unless the model's lease holds the worker's token).  The commit that applies the
chunk moves the checkpoint's cursor past ``C``, which makes the record stale: a record counts only while
its cursor equals the model's committed cursor, so no clearing round trip is needed.  An attempt that
never reached its commit (the worker process died: SIGKILL, OOM killer, a native abort) therefore stays
counted, and the record survives the worker.  When :data:`BEGIN_LUA` finds ``max_block_attempts``
failed attempts at the cursor it refuses (``exhausted``) and the worker marks the model ``error`` with
the reason instead of running it; every other model keeps progressing.

One attempt is recorded per batch (``read_batch`` chunks of one model), not per chunk: one round trip
per batch instead of one more per chunk (a fenced commit is one round trip per chunk).  A worker that
dies on a later chunk of a batch leaves a stale record, so that first death is not counted; every
following worker starts its batch at that chunk, so the next deaths are: a crash loop ends after at
most ``max_block_attempts + 1`` deaths.  Exceptions are counted exactly (the live worker records a
failure at the failing chunk's cursor) and their text is kept (``reason``) for the final ``error``; a
crash leaves "the worker process died".  Work that ends without a failure and without a commit (a
successful restore, a budget abort, a lease lost by a live worker) gives its attempt back
(:data:`SETTLE_LUA`, fenced by the attempt's id).  A Redis outage in the middle of a batch counts as a
failed attempt (nothing can be written then).

Models are loaded and advanced together (a worker's scan restores the models it leased in one batch; a round
advances every held model's next chunk in one stacked update), each with its own attempt.  A worker that dies there
leaves an attempt on every model of the batch, the culprit's and the innocent ones'; so a model whose record shows an
attempt at its cursor runs alone, after the others (``Worker.load_many``, ``Worker.advance_many``): the culprit's
next deaths are its own, and the innocent ones succeed alone and give their attempt back.

**Block budget.**  A block (``block_size`` observations, one ``ModelEngine.update`` call, including any
re-annealing it triggers) gets ``block_budget_seconds`` of wall-clock time.  The check runs at every
log-likelihood / gradient evaluation of the model's family (each SGHMC step and each annealing step)
and at every engine heartbeat, so an overrun is noticed within one SGHMC step.  The choice made here:
**abort** the block at that point (raise :class:`BlockBudgetExceeded`), discard the in-memory engine
(its generator and particles moved; the committed checkpoint did not), mark the model ``degraded``
with the reason, give the lease back, and *park* the model for ``block_budget_cooldown_seconds``
(no worker leases it meanwhile).  Nothing was committed, so exactly-once holds; after the cool-down a
worker restores the model from its checkpoint and retries the same block with the same generator
state, so a block that then fits the budget (a quieter machine, a larger budget) gives the same bits
as an uninterrupted run, and the commit sets the status back to ``ok``.  Finishing the block instead
would have kept every other model of the worker waiting for it (the reviewed case: minutes).
"""

from __future__ import annotations

import json
import secrets
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from workers.store.keys import Keys
from workers.store.scripts import run_calls

if TYPE_CHECKING:
    from workers.store.commit import Scripts

CRASH_REASON = "the worker process died"

# Count an attempt for several models in ONE script call (Attempts.begin_many), one after the other, each fenced by
# its own lease token; an error of one (raised before its first write: its reads come first) is its own.
# KEYS: lease, attempts per call.  ARGV: worker id, now (unix s), limit, what; then per call: token, cursor, model
# fingerprint, attempt id.  Returns one reply per call: {'lost'} | {'exhausted', n, reason} | {'ok', n} (n = attempts
# at the cursor, this one included) | {'error', message}.
BEGIN_LUA = """
local function begin(lease, attempts, token, cursor, fp, id)
  if redis.call('GET', lease) ~= token then return {'lost'} end
  local rec = redis.call('HMGET', attempts, 'cursor', 'model', 'attempts', 'reason')
  local n, last = 0, ''
  if rec[1] == cursor and rec[2] == fp then n = tonumber(rec[3]) or 0; last = rec[4] or '' end
  if last == '' then last = 'the worker process died' end
  if n >= tonumber(ARGV[3]) then return {'exhausted', n, last} end
  if n == 0 then last = '' end
  redis.call('HSET', attempts, 'cursor', cursor, 'model', fp, 'attempts', n + 1, 'reason', '', 'last', last,
             'worker', ARGV[1], 'started_at', ARGV[2], 'what', ARGV[4], 'id', id)
  return {'ok', n + 1}
end
local replies = {}
for i = 1, #KEYS / 2 do
  local a = 4 * i
  local ok, reply = pcall(begin, KEYS[2 * i - 1], KEYS[2 * i], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
  if not ok then reply = {'error', type(reply) == 'table' and reply.err or tostring(reply)} end
  replies[i] = reply
end
return replies
"""

# KEYS: attempts.  ARGV: attempt id, reason ('' = give the attempt back), parked until (unix s, '' = not
# parked).  Fenced by the attempt id rather than the lease: an attempt that lost its lease can still be given
# back, and nothing is written once another attempt (another worker) started.  Returns 1 if updated, else 0.
SETTLE_LUA = """
local rec = redis.call('HMGET', KEYS[1], 'id', 'attempts')
if rec[1] ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('HSET', KEYS[1], 'attempts', math.max((tonumber(rec[2]) or 1) - 1, 0))
else
  redis.call('HSET', KEYS[1], 'reason', ARGV[2])
end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'parked_until', ARGV[3])
  redis.call('HINCRBY', KEYS[1], 'overruns', 1)
end
return 1
"""


class BlockBudgetExceeded(Exception):
    """A block ran past ``block_budget_seconds`` (wall clock); raised inside the engine to abort it."""

    def __init__(self, budget: float, elapsed: float):
        super().__init__(f"a block took more than the block budget of {budget:g} s (aborted after {elapsed:.1f} s)")
        self.budget, self.elapsed = budget, elapsed


class Exhausted(Exception):
    """The model failed ``max_block_attempts`` times at the same cursor: it is quarantined (status ``error``)."""


def attempts_key(keys: Keys, tenant: str, model: str) -> str:
    """``P:T:attempts:{m}``: hash ``cursor, model, attempts, reason`` (of the attempt in progress, set when
    it fails), ``last`` (the previous failure), ``worker, started_at, what, parked_until, overruns``
    (:meth:`workers.store.keys.Keys.attempts`; removed with the model or its stream)."""
    return keys.attempts(tenant, model)


def fingerprint(raw_config: bytes) -> str:
    """Identifies the model's config, so a model deleted and re-created under the same name starts afresh."""
    return format(zlib.crc32(raw_config), "08x")


def exhausted_message(attempts: int, reason: str) -> str:
    """The ``error`` text of a quarantined model."""
    return f"quarantined after {attempts} failed attempts at the same block; last: {reason or CRASH_REASON}"


def is_deterministic(err: BaseException) -> bool:
    """Errors that the same input always reproduces (bad data, NaN/inf): ``error`` at once, no retries."""
    from workers.sgais import NumericalError

    return isinstance(err, NumericalError | ValueError)


@dataclass
class Budget:
    """A wall-clock deadline for the block being absorbed; ``check()`` raises :class:`BlockBudgetExceeded`.

    ``seconds``: the budget (``None`` or ``<= 0`` = no budget).  ``start()`` arms it for one block, ``stop()``
    disarms it (a disarmed check costs one attribute read).
    """

    seconds: float | None
    clock: Callable[[], float] = time.monotonic
    started: float | None = None

    def start(self) -> None:
        if self.seconds is not None and self.seconds > 0:
            self.started = self.clock()

    def stop(self) -> None:
        self.started = None

    def check(self) -> None:
        if self.started is not None:
            elapsed = self.clock() - self.started
            if elapsed > self.seconds:  # type: ignore[operator]
                raise BlockBudgetExceeded(float(self.seconds), elapsed)  # type: ignore[arg-type]


def install_budget_check(engine: Any, budget: Budget) -> None:
    """Make every log-likelihood and gradient evaluation of ``engine``'s family check ``budget`` first.

    The family's methods are shadowed on this family instance only (the engine's own code is not touched);
    the sampler calls them at every annealing step and every SGHMC step, so an overrun is noticed within
    one SGHMC step.  The check raises before the evaluation, outside any torch kernel.
    """
    family = engine.family
    # the stacked kernel (models/stack.py) calls the stacked_* methods of its first model's family; the
    # worker advances one model per call, so that is this model's family
    names = ("log_likelihood", "grad_log_likelihood", "stacked_log_likelihood", "stacked_grad_log_likelihood",
             "stacked_gradient_statistics", "stacked_grad_from_statistics", "stacked_grad_from_step")  # fmt: skip
    for name in names:
        if not hasattr(family, name):
            continue
        original = getattr(family, name)

        def checked(*args: Any, _original: Callable = original, **kwargs: Any) -> Any:
            budget.check()
            return _original(*args, **kwargs)

        setattr(family, name, checked)


#: Models per :data:`BEGIN_LUA` call (:meth:`Attempts.begin_many`), as :data:`workers.store.commit.COMMITS_PER_SCRIPT`:
#: the client's cost of a command spread over many models, one call's arguments small and Redis held briefly.
ATTEMPTS_PER_SCRIPT = 64


class Attempts:
    """The fenced attempt record of each model (Redis), see the module docstring."""

    def __init__(self, r: redis.Redis, keys: Keys, worker_id: str):
        self.r, self.keys, self.worker_id = r, keys, worker_id
        self._begin = r.register_script(BEGIN_LUA)
        self._settle = r.register_script(SETTLE_LUA)

    def begin(
        self, tenant: str, model: str, token: str, cursor: bytes, fp: str, limit: int, what: str
    ) -> tuple[int, str]:
        """Count an attempt at ``cursor``: its number (1 = first) and id (for :meth:`settle`).

        Raises
        ------
        workers.store.commit.LeaseLost
            The lease no longer holds ``token`` (nothing written).
        Exhausted
            ``limit`` attempts at ``cursor`` failed already (nothing written); the message is the ``error`` text.
        """
        (got,) = self.begin_many([(tenant, model, token, cursor, fp)], limit, what)
        if isinstance(got, Exception):
            raise got
        return got

    def begin_many(
        self, calls: list[tuple[str, str, str, bytes, str]], limit: int, what: str
    ) -> list[tuple[int, str] | Exception]:
        """:meth:`begin` for each ``(tenant, model, token, cursor, fp)`` of ``calls``, all in ONE round trip,
        :data:`ATTEMPTS_PER_SCRIPT` to a :data:`BEGIN_LUA` call (each fenced by its own lease token, run by Redis in
        order).  Per call, in order: the attempt's (number, id), or its exception (LeaseLost, Exhausted, a Redis
        error of its own: nothing written for it; or of its script call).  A connection failure raises (nothing is
        known of any call)."""
        from workers.store.commit import LeaseLost

        ids = [secrets.token_hex(8) for _ in calls]
        head = [self.worker_id, f"{time.time():.3f}", limit, what]
        scripts = []
        for i in range(0, len(calls), ATTEMPTS_PER_SCRIPT):
            keys: list[str] = []
            args: list[Any] = list(head)
            for (tenant, model, token, cursor, fp), attempt_id in zip(
                calls[i : i + ATTEMPTS_PER_SCRIPT], ids[i : i + ATTEMPTS_PER_SCRIPT], strict=True
            ):
                keys += [self.keys.lease(tenant, model), attempts_key(self.keys, tenant, model)]
                args += [token, cursor, fp, attempt_id]
            scripts.append((keys, args))
        replies = []
        for group, script_replies in zip(
            range(0, len(calls), ATTEMPTS_PER_SCRIPT), run_calls(self.r, self._begin, scripts), strict=True
        ):
            n = len(calls[group : group + ATTEMPTS_PER_SCRIPT])
            if isinstance(script_replies, Exception):  # the script call failed: no call of it ran
                replies += [script_replies] * n
                continue
            replies += [
                redis.ResponseError(res[1].decode(errors="replace")) if res[0] == b"error" else res
                for res in script_replies
            ]
        out: list[tuple[int, str] | Exception] = []
        for (_, model, *_), res, attempt_id in zip(calls, replies, ids, strict=True):
            if isinstance(res, Exception):
                out.append(res)
            elif res[0] == b"lost":
                out.append(LeaseLost(model))
            elif res[0] == b"exhausted":
                out.append(Exhausted(exhausted_message(int(res[1]), res[2].decode())))
            else:
                out.append((int(res[1]), attempt_id))
        return out

    def settle(
        self, tenant: str, model: str, attempt_id: str, *, reason: str = "", parked_until: float | None = None
    ) -> bool:
        """End an attempt without a commit: ``reason`` = it failed (kept for the ``error`` text); empty = give
        the attempt back (a successful restore, a budget abort, a lease lost by a live worker).
        ``parked_until``: no worker leases the model before this unix time.  False if another attempt started
        meanwhile (nothing written)."""
        return bool(
            self._settle(
                keys=[attempts_key(self.keys, tenant, model)],
                args=[attempt_id, reason, "" if parked_until is None else f"{parked_until:.3f}"],
            )
        )

    def give_back_many(self, calls: list[tuple[str, str, str]]) -> list[bool | Exception]:
        """:meth:`settle` with no reason (the attempt given back) for each ``(tenant, model, attempt_id)`` of
        ``calls``, in ONE round trip: per call whether it was written, or its script's error.  A connection failure
        raises."""
        scripts = [([attempts_key(self.keys, t, model)], [attempt_id, "", ""]) for t, model, attempt_id in calls]
        return [r if isinstance(r, Exception) else bool(r) for r in run_calls(self.r, self._settle, scripts)]

    def parked(self, refs: list[tuple[str, str]], now: float | None = None) -> set[tuple[str, str]]:
        """The ``(tenant, model)`` of ``refs`` parked after a budget overrun (one round trip)."""
        if not refs:
            return set()
        now = time.time() if now is None else now
        pipe = self.r.pipeline(transaction=False)
        for tenant, model in refs:
            pipe.hget(attempts_key(self.keys, tenant, model), "parked_until")
        return {
            ref for ref, until in zip(refs, pipe.execute(), strict=True) if until is not None and float(until) > now
        }

    def record(self, tenant: str, model: str) -> dict[str, str]:
        """The raw record (tests, diagnostics)."""
        raw: dict[bytes, bytes] = self.r.hgetall(attempts_key(self.keys, tenant, model))
        return {k.decode(): v.decode() for k, v in raw.items()}


def set_status(
    r: redis.Redis, keys: Keys, *, tenant: str, model: str, stream: str | None, token: str, status: str, message: str
) -> bool:
    """Fenced: set the checkpoint's ``status``/``error``, publish an ``error`` event (``status`` in it), drop the
    lease.  A model without a checkpoint gets the empty counters the API expects.  False if the lease moved."""
    ckpt, lease = keys.checkpoint(tenant, model), keys.lease(tenant, model)
    with r.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(lease)
            if pipe.get(lease) != token.encode():
                return False
            fresh = not pipe.hexists(ckpt, "chunks")
            pipe.multi()
            fields = {"status": status, "error": message}
            if fresh:
                fields.update(chunks="0", observations="0", log_evidence="0.0", cursor="0-0")
            pipe.hset(ckpt, mapping=fields)
            if stream is not None:
                if status == "error":  # out of the stream's common count (lua/commit.lua)
                    pipe.zadd(keys.stream_obs(tenant, stream), {model: "+inf"})
                event = {"type": "error", "model": model, "stream": stream, "status": status, "error": message}
                pipe.publish(keys.events(tenant, stream), json.dumps(event))
            pipe.delete(lease)
            pipe.execute()
            return True
        except redis.WatchError:
            return False


class QuarantineHooks:
    """The worker's side of quarantine and the block budget, mixed into :class:`workers.worker.Worker`.

    Needs ``self.r``, ``self.keys``, ``self.scripts`` (the store's Lua scripts), ``self.s`` (Settings),
    ``self.id``, ``self.held`` and ``self.record_error`` of the worker; a held model needs ``tenant, name, token,
    cfg, engine``.
    """

    r: redis.Redis
    keys: Keys
    scripts: Scripts
    s: Any
    id: str

    if TYPE_CHECKING:  # the worker's read-only property (a view of its leases)

        @property
        def held(self) -> dict[str, Any]: ...

    _attempts: Attempts | None = None

    @property
    def attempts(self) -> Attempts:
        if self._attempts is None:
            self._attempts = Attempts(self.r, self.keys, self.id)
        return self._attempts

    def begin_attempt(self, h: Any, cursor: bytes, what: str) -> None:
        """Count an attempt at ``cursor`` before work on ``h`` that may fail or crash (see the module docstring).

        Raises LeaseLost, or :class:`Exhausted` when the model is to be quarantined instead.
        """
        (err,) = self.begin_attempts([h], [cursor], what)
        if err is not None:
            raise err

    def begin_attempts(self, hs: list[Any], cursors: list[bytes], what: str) -> list[Exception | None]:
        """:meth:`begin_attempt` for each model of ``hs`` at its cursor, in one round trip
        (:meth:`Attempts.begin_many`): per model, None (counted) or what :meth:`begin_attempt` would raise.
        A connection failure raises."""
        for h in hs:
            if not getattr(h, "fp", ""):
                h.fp = fingerprint(json.dumps(h.cfg, sort_keys=True).encode())
            h.attempt_id = ""  # set once this attempt is recorded
        calls = [(h.tenant, h.name, h.token, cursor, h.fp) for h, cursor in zip(hs, cursors, strict=True)]
        got = self.attempts.begin_many(calls, self.s.max_block_attempts, f"{what} by {self.id}")
        errors: list[Exception | None] = []
        for h, cursor, res in zip(hs, cursors, got, strict=True):
            if isinstance(res, Exception):
                errors.append(res)
                continue
            h.attempt, h.attempt_id = res
            h.attempt_cursor = cursor
            errors.append(None)
        return errors

    def end_attempt(self, h: Any) -> None:
        """The attempt ended well without a commit (a restore): give it back."""
        self.attempts.settle(h.tenant, h.name, h.attempt_id)
        h.attempt_id = ""

    def end_attempts(self, hs: list[Any]) -> None:
        """:meth:`end_attempt` of each model of ``hs``, in one round trip (:meth:`Attempts.give_back_many`).  An
        attempt another worker's began meanwhile is left to it, as :meth:`end_attempt` leaves it."""
        self.attempts.give_back_many([(h.tenant, h.name, h.attempt_id) for h in hs])
        for h in hs:
            h.attempt_id = ""

    def arm_budget(self, h: Any) -> None:
        """Give the freshly built engine of ``h`` its block budget (checked inside every block)."""
        h.budget = Budget(self.s.block_budget_seconds)
        install_budget_check(h.engine, h.budget)

    def model_failed(self, h: Any, err: Exception) -> bool:
        """Handle an exception raised by work on ``h``: True if handled (the model is dropped from this worker),
        False for the worker's own conditions (lost lease, Redis unavailable) that the caller must re-raise."""
        from workers.store.commit import LeaseLost

        if isinstance(err, LeaseLost):
            # this worker is alive: losing the lease (a block longer than the lease, a rebalance) is no failure
            if h.attempt_id:
                self.attempts.settle(h.tenant, h.name, h.attempt_id)
                h.attempt_id = ""
            return False
        if isinstance(err, redis.ConnectionError | redis.TimeoutError):
            return False
        ref = f"{h.tenant}/{h.name}"
        self.held.pop(ref, None)
        stream = h.cfg.get("stream") if h.cfg else None
        attempt_id = h.attempt_id
        try:
            if isinstance(err, Exhausted):
                self._log_failure(h, "quarantined", err)
                set_status(self.r, self.keys, tenant=h.tenant, model=h.name, stream=stream, token=h.token,
                           status="error", message=str(err))  # fmt: skip
            elif isinstance(err, BlockBudgetExceeded):
                self._log_failure(h, "degraded", err)
                until = time.time() + self.s.block_budget_cooldown_seconds
                if attempt_id:
                    self.attempts.settle(h.tenant, h.name, attempt_id, parked_until=until)
                message = f"{err}; the model is parked until {time.strftime('%H:%M:%S', time.gmtime(until))} UTC"
                set_status(self.r, self.keys, tenant=h.tenant, model=h.name, stream=stream, token=h.token,
                           status="degraded", message=message)  # fmt: skip
            elif is_deterministic(err):
                self.record_error(h, err)  # type: ignore[attr-defined]
            else:
                reason = f"{type(err).__name__}: {err}"
                if not attempt_id or getattr(h, "attempt_cursor", None) != h.cursor:
                    # the worker counts one attempt per batch of chunks; this failure, on a later chunk, is
                    # counted now (Exhausted: it was the last one allowed)
                    self.begin_attempt(h, h.cursor, "block")
                    attempt_id = h.attempt_id
                self._log_failure(h, f"attempt {h.attempt} failed", err)
                if h.attempt >= self.s.max_block_attempts:
                    self.attempts.settle(h.tenant, h.name, attempt_id, reason=reason)
                    set_status(self.r, self.keys, tenant=h.tenant, model=h.name, stream=stream, token=h.token,
                               status="error", message=exhausted_message(h.attempt, reason))  # fmt: skip
                else:  # retried from the checkpoint, by this worker or another
                    self.attempts.settle(h.tenant, h.name, attempt_id, reason=reason)
                    self.scripts.release(h.tenant, h.name, h.token)
        except Exhausted as exhausted:
            set_status(self.r, self.keys, tenant=h.tenant, model=h.name, stream=stream, token=h.token,
                       status="error", message=str(exhausted))  # fmt: skip
        except LeaseLost:
            pass  # dropped; the next holder retries
        except (redis.ConnectionError, redis.TimeoutError):
            raise
        except redis.RedisError as redis_err:  # e.g. a script error: the model stays dropped, the lease expires
            import logging

            logging.getLogger("sgais.worker").error("worker %s: could not record %s: %s", self.id, ref, redis_err)
        h.engine = None
        return True

    def _log_failure(self, h: Any, what: str, err: BaseException) -> None:
        import logging

        log = logging.getLogger("sgais.worker")
        if isinstance(err, BlockBudgetExceeded | Exhausted):
            log.error("worker %s: model %s/%s %s: %s", self.id, h.tenant, h.name, what, err)
        else:
            log.error("worker %s: model %s/%s %s", self.id, h.tenant, h.name, what, exc_info=err)
