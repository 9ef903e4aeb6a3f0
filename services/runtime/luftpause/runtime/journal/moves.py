"""Fork, export and import of runs: the runtime's side of `forks` and `bundle`.

Shell module: reads the journal file (an export's records come from disk, the source of
truth) and writes through `Runtime.adopt`, which journals one `batch` record (a fork of n
runs, or an import, is one line: after a crash all of it is there or none) and then runs the
new runs as a restart would. Who may: a run belongs to a key (`owners`); a fork stays its
source's key's, an import keeps each run's, and a plain key may fork, export or import only
its own key's runs (the operator and service keys any), as for a child.

Exporting a run that is still going gives its last complete round (and, if it waits for the
user's approval, that question with the answers given so far): what its journal holds. The
run itself goes on here; importing the bundle elsewhere makes a second copy that resumes at
that round, so cancel one of them to move a run rather than copy it.
"""

from __future__ import annotations

from typing import Any

import structlog

from luftpause.common.auth import Identity
from luftpause.common.keys import KeysFile
from luftpause.runtime.core import budget, forks, journal
from luftpause.runtime.core import machine as m
from luftpause.runtime.core.bundle import Bundle, decode, make
from luftpause.runtime.core.errors import BundleError, Forbidden, NoRun, RequestError
from luftpause.runtime.core.owners import owned
from luftpause.runtime.loop.runtime import Runtime, new_handle

_READ_CHUNK = 1 << 16

log = structlog.get_logger(service="runtime")


class Migrations:
    """Fork, export and import over one `Runtime`."""

    def __init__(self, runtime: Runtime, keys: KeysFile | None = None) -> None:
        self.runtime = runtime
        self.keys = keys

    async def fork(
        self,
        handle: str,
        n: int,
        instructions: str | list[str] | None,
        identity: Identity,
        caller: str,
        **overrides: Any,
    ) -> tuple[list[str], int]:
        """n new runs from `handle`'s last complete round (`forks`): their handles, the round."""
        try:
            each = forks.instructions_for(n, instructions)
        except ValueError as exc:
            raise RequestError(f"bad arguments: {exc}") from exc
        await self.runtime.known([handle])
        source = self._run(handle)
        mine = await self._records_of({handle})
        if source.phase is m.Phase.FINISHED:  # as it was before its answer, no round of its own
            source = journal.replay([r for r in mine if r.get("type") != "finished"]).runs[handle]
        samples = forks.learned(mine, source.rounds)
        parent = source.spec.parent
        if parent is not None and parent in self.runtime.runs:
            blocked = budget.blocking(self.runtime.runs, parent)
            if blocked is not None:
                raise RequestError(f"parent's {blocked.reason}")
        now = self.runtime.clock()
        records = []
        for instruction in each:
            try:
                spec = forks.fork_spec(source.spec, new_handle(), now, caller=caller, **overrides)
            except (TypeError, ValueError) as exc:
                raise RequestError(f"bad arguments: {exc}") from exc
            spec = self._owned(spec, source.spec, identity)
            records.append(forks.forked_record(spec, source, instruction, samples))
        handles = await self.runtime.adopt(forks.batch_record(records))
        log.info("run.forked", run=handle, forks=handles, round=source.rounds)
        return handles, source.rounds

    async def export(self, handle: str, identity: Identity, *, subtree: bool = False) -> Bundle:
        """The bundle of `handle` (and, with `subtree`, every run below it), as journaled."""
        await self.runtime.known([handle])
        source = self._run(handle)
        self._may(source.spec, identity)
        wanted = [handle, *self.runtime.descendants(handle)] if subtree else [handle]
        mine = await self._records_of(set(wanted))
        return make(handle, mine, exported_at=self.runtime.clock())

    async def import_(self, data: Any, identity: Identity) -> list[str]:
        """The bundle's runs, journaled here and resumed at their round; their handles."""
        if not isinstance(data, str | bytes):
            raise BundleError("bundle_malformed", "a bundle is JSON text (a string)")
        bundle = decode(data)
        taken = [h for h in bundle.handles if h in self.runtime.runs]
        if taken:
            raise BundleError(
                "bundle_conflict", f"runs already exist here: {', '.join(sorted(taken))}"
            )
        replayed = journal.replay(bundle.records)
        for h in bundle.handles:
            spec = replayed.runs[h].spec
            if spec.key is not None:
                self._owned(spec, spec, identity)
        handles = await self.runtime.adopt(forks.batch_record(list(bundle.records)))
        log.info("runs.imported", runs=handles, root=bundle.root)
        return handles

    async def _records_of(self, handles: set[str]) -> list[dict[str, Any]]:
        """The runs' journaled records, in journal order, batches taken apart."""
        return await self.runtime.journal.committed(handles)

    def _run(self, handle: str) -> m.RunState:
        run = self.runtime.runs.get(handle)
        if run is None:
            raise NoRun(f"no run {handle}")
        return run.state

    def _owned(self, spec: m.RunSpec, source: m.RunSpec, identity: Identity) -> m.RunSpec:
        """`spec` with `source`'s key, if the request's identity may have it (`owners`)."""
        if source.key is None:
            return spec
        keys = None if self.keys is None else self.keys.current()
        try:
            return owned(spec, identity, parent=source, keys=keys)
        except RequestError as exc:
            raise Forbidden(str(exc)) from exc

    def _may(self, spec: m.RunSpec, identity: Identity) -> None:
        self._owned(spec, spec, identity)
