"""The store's Redis Lua scripts, kept as ``.lua`` files in ``workers/store/lua/`` (package data) and
read once at import with :mod:`importlib.resources`."""

from __future__ import annotations

from importlib.resources import files
from typing import Any

import redis


def lua(name: str) -> str:
    """The source of ``workers/store/lua/<name>.lua``."""
    return files("workers.store").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


_STREAM_STATE = lua("stream_state")
#: Fenced commits, several models' in one call (workers.store.commit.Scripts.commit_many): KEYS/ARGV in the file.
COMMIT_LUA = _STREAM_STATE + lua("commit")
#: The stream's state for the stream posterior, read-only.
STREAM_LUA = _STREAM_STATE + lua("stream")
#: Fenced compare-and-set of a stream's leader record, with its posterior event and alert.
LEADER_LUA = lua("leader")
#: Seq check + XADD + meta update of an ingested chunk (workers.store.reads.ingest).
INGEST_LUA = lua("ingest")
#: The stream posterior's inputs, read-only (workers.store.reads.stream_posterior).
POSTERIOR_STATES_LUA = lua("posterior_states")
#: The trace rows of several models at one count, read-only (workers.store.reads.stream_posterior).
ROWS_AT_LUA = lua("rows_at")
#: The same fields of several hashes, read-only (workers.store.reads.stream_status).
HMGET_EACH_LUA = lua("hmget_each")
#: Renew leases that still hold their tokens (workers.store.commit.Scripts.renew).
RENEW_LUA = lua("renew")
#: Delete a lease that still holds its token.
RELEASE_LUA = lua("release")


def run_calls(r: redis.Redis, script: Any, calls: list[tuple[list[Any], list[Any]]]) -> list[Any]:
    """Run the registered ``script`` (``Redis.register_script``) once per ``(keys, args)`` of ``calls``, in order, in
    ONE round trip: a plain ``EVALSHA`` for one call (a pipeline adds a ``SCRIPT EXISTS`` round trip), else a
    pipeline.  Per call its reply, or the ``redis.ResponseError`` its script raised (as a value); a connection
    failure raises (nothing is known of any call)."""
    if len(calls) == 1:
        keys, args = calls[0]
        try:
            return [script(keys=keys, args=args)]
        except redis.ResponseError as err:
            return [err]
    pipe = r.pipeline(transaction=False)
    for keys, args in calls:
        script(keys=keys, args=args, client=pipe)
    return pipe.execute(raise_on_error=False)


class Sent:
    """Script calls written to Redis whose replies are not read yet (:func:`send_calls`): Redis runs them while the
    caller works on, and :meth:`replies` reads them.  The connection stays out of the pool until then."""

    def __init__(self, r: redis.Redis, script: Any, calls: list[tuple[list[Any], list[Any]]]):
        self.r, self.script = r, script
        self.calls: list[tuple[list[Any], list[Any]]] = []
        self.pool = r.connection_pool
        self.conn: Any = self.pool.get_connection()
        self.send(calls)

    def send(self, calls: list[tuple[list[Any], list[Any]]]) -> None:
        """Write more calls on the same connection, after those sent before (Redis runs them in that order; their
        replies come after the earlier ones').  A connection failure raises, the connection closed (nothing is known
        of any call)."""
        if self.conn is None:
            raise RuntimeError("the replies were read or dropped already")
        try:
            commands = [("EVALSHA", self.script.sha, len(keys), *keys, *args) for keys, args in calls]
            self.conn.send_packed_command(self.conn.pack_commands(commands))
        except BaseException:
            self.drop()
            raise
        self.calls += calls

    def replies(self) -> list[Any]:
        """Per call its reply or the ``redis.ResponseError`` its script raised, as :func:`run_calls` returns them.
        Calls that met a script cache without the script (``NOSCRIPT``: Redis restarted or flushed it; nothing of
        them ran) are run again, in order, after loading it.  A connection failure raises (nothing is known of
        any call)."""
        if self.conn is None:
            raise RuntimeError("the replies were read or dropped already")
        out: list[Any] = []
        try:
            for _ in self.calls:
                try:
                    out.append(self.conn.read_response())
                except redis.ResponseError as err:
                    out.append(err)
        except BaseException:
            self.conn.disconnect()  # replies may be left unread: never back to the pool as it is
            raise
        finally:
            self.pool.release(self.conn)
            self.conn = None
        missing = [i for i, v in enumerate(out) if isinstance(v, redis.exceptions.NoScriptError)]
        if missing:
            self.r.script_load(self.script.script)
            for i, reply in zip(missing, run_calls(self.r, self.script, [self.calls[i] for i in missing]), strict=True):
                out[i] = reply
        return out

    def drop(self) -> None:
        """Give the connection back without reading the replies (the caller failed before it could): the connection
        is closed, so no later command reads them.  Nothing is known of the calls.  Does nothing once read."""
        if self.conn is not None:
            self.conn.disconnect()
            self.pool.release(self.conn)
            self.conn = None


def send_calls(r: redis.Redis, script: Any, calls: list[tuple[list[Any], list[Any]]]) -> Sent:
    """Write one ``EVALSHA`` of the registered ``script`` per ``(keys, args)`` of ``calls`` in one write, without
    waiting for the replies (:meth:`Sent.replies`; run in order, as :func:`run_calls` runs them).  A connection
    failure raises (nothing was sent, or nothing is known)."""
    return Sent(r, script, calls)
