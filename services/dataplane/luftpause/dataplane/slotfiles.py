"""Saved slot contexts: llama.cpp's slot save and restore around a turn (endpoint `slot_saves`).

Shell module. When the scheduler places a turn in a slot whose content a paused run will want
back, it names a file to save that content to first; when the turn's own run lost its slot, it
names the file its context was saved to. Before the turn's request the dataplane asks the engine,
in this order (the save must read the slot before the restore overwrites it):

    POST {replica}/slots/{slot}?action=save     {"filename": ...}
    POST {replica}/slots/{slot}?action=restore  {"filename": ...}

Calls on one file go out in the order the turns were placed (`FileOrder`). The scheduler may
name a file to save into while a turn placed just before still has to restore from it, or name
a file to restore from whose save another turn has only just begun; two handlers' requests reach
the engine in either order, so each call on a file waits for the call on that file before it
(within this process, at most `SLOT_ACTION_TIMEOUT_S`).

llama.cpp runs both on its own task loop, in the order they arrive, and they take milliseconds
(a save writes the slot's KV: about 8 KB per token for Gemma 3 270M). Neither can change what a
turn returns: llama.cpp compares a restored context's tokens with the next prompt and reuses only
the common prefix. So a failure (no `--slot-save-path`, a missing file, a timeout) costs only the
prefill it would have saved: it is logged, counted in `luftpause_dataplane_slot_actions`, and the
turn goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import structlog

from luftpause.dataplane.errors import EngineStreamBroken, EngineUnreachable
from luftpause.dataplane.forwarding import upstream_headers
from luftpause.dataplane.metrics import Metrics
from luftpause.dataplane.transport import EngineTransport

# A save writes the slot's whole KV cache; on a large model and context that is a GB or more.
SLOT_ACTION_TIMEOUT_S = 30.0

log = structlog.get_logger("luftpause.dataplane.slotfiles")


class FileOrder:
    """Per replica and file, the last slot call placed on it; each call waits for the one
    before. Calls only wait for calls registered earlier, so no two can wait for each other.
    """

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], asyncio.Future[None]] = {}

    def enqueue(
        self, replica_id: str, filename: str
    ) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        """(the call on this file to wait for, or None; this call's own, to finish)."""
        key = (replica_id, filename)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        before = self._last.get(key)
        self._last[key] = mine
        return before, mine

    def finish(self, replica_id: str, filename: str, mine: asyncio.Future[None]) -> None:
        if not mine.done():
            mine.set_result(None)
        key = (replica_id, filename)
        if self._last.get(key) is mine:
            del self._last[key]

    def __len__(self) -> int:
        """Files with a call registered and not finished."""
        return len(self._last)


async def prepare_slot(
    transport: EngineTransport,
    metrics: Metrics,
    order: FileOrder,
    *,
    replica_id: str,
    replica_url: str,
    api_key: str,
    slot: int,
    save: str | None,
    restore: str | None,
) -> dict[str, bool]:
    """Save `slot` to `save`, then restore `restore` into it; each only if named, and each
    after the call on the same file placed before it. Whether each named one worked.
    """
    done: dict[str, bool] = {}
    headers = upstream_headers((), api_key)  # JSON, the engine's key, nothing of the client's
    # Both calls take their place before the first await: placement order is the order the
    # handlers resume in, so this is the order the scheduler named the files in.
    steps = [
        (action, filename, *order.enqueue(replica_id, filename))
        for action, filename in (("save", save), ("restore", restore))
        if filename is not None
    ]
    try:
        for action, filename, before, mine in steps:
            if before is not None:
                await _wait(before)
            url = f"{replica_url.rstrip('/')}/slots/{slot}?action={action}"
            error = await _post(transport, url, headers, filename)
            metrics.slot_action(action, error is None)
            done[action] = error is None
            if error is not None:
                log.warning(
                    f"slot {action} failed",
                    replica=replica_id,
                    slot=slot,
                    file=filename,
                    error=error,
                )
            order.finish(replica_id, filename, mine)  # the next call on this file may go
    finally:  # cancelled (the client left): release every place this turn took
        for _, filename, _, left in steps:
            order.finish(replica_id, filename, left)
    return done


async def _wait(before: asyncio.Future[None]) -> None:
    """Until the call before has finished, or `SLOT_ACTION_TIMEOUT_S` (it is bounded too)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(before), SLOT_ACTION_TIMEOUT_S)


async def _post(
    transport: EngineTransport, url: str, headers: dict[str, str], filename: str
) -> str | None:
    """POST one slot action; None when the engine did it, else what went wrong."""
    body = json.dumps({"filename": filename}).encode()
    try:
        async with asyncio.timeout(SLOT_ACTION_TIMEOUT_S):
            response = await transport.send(url, headers, body)
            try:
                data = await response.read()
            finally:
                response.close()
    except TimeoutError:
        return f"no answer in {SLOT_ACTION_TIMEOUT_S:.0f} s"
    except (EngineUnreachable, EngineStreamBroken) as exc:
        return exc.message
    if 200 <= response.status < 300:
        return None
    return f"engine status {response.status}: {_message(data)}"


def _message(data: bytes) -> str:
    """The error message of an OpenAI-style error body, else the body's start."""
    try:
        message = json.loads(data)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return data[:200].decode(errors="replace")
    return str(message)[:200]
