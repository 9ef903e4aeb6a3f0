"""Saved slot contexts: llama.cpp's slot save and restore around a turn (endpoint `slot_saves`).

Shell module. When the scheduler places a turn in a slot whose content a paused run will want
back, it names a file to save that content to first; when the turn's own run lost its slot, it
names the file its context was saved to. Before the turn's request the dataplane asks the engine,
in this order (the save must read the slot before the restore overwrites it):

    POST {replica}/slots/{slot}?action=save     {"filename": ...}
    POST {replica}/slots/{slot}?action=restore  {"filename": ...}

llama.cpp runs both on its own task loop, in the order they arrive, and they take milliseconds
(a save writes the slot's KV: about 8 KB per token for Gemma 3 270M). Neither can change what a
turn returns: llama.cpp compares a restored context's tokens with the next prompt and reuses only
the common prefix. So a failure (no `--slot-save-path`, a missing file, a timeout) costs only the
prefill it would have saved: it is logged, counted in `luftpause_dataplane_slot_actions`, and the
turn goes on.
"""

from __future__ import annotations

import asyncio
import json

import structlog

from luftpause.dataplane.errors import EngineStreamBroken, EngineUnreachable
from luftpause.dataplane.forwarding import upstream_headers
from luftpause.dataplane.metrics import Metrics
from luftpause.dataplane.transport import EngineTransport

# A save writes the slot's whole KV cache; on a large model and context that is a GB or more.
SLOT_ACTION_TIMEOUT_S = 30.0

log = structlog.get_logger("luftpause.dataplane.slotfiles")


async def prepare_slot(
    transport: EngineTransport,
    metrics: Metrics,
    *,
    replica_id: str,
    replica_url: str,
    api_key: str,
    slot: int,
    save: str | None,
    restore: str | None,
) -> None:
    """Save `slot` to `save`, then restore `restore` into it; each only if named."""
    headers = upstream_headers((), api_key)  # JSON, the engine's key, nothing of the client's
    for action, filename in (("save", save), ("restore", restore)):
        if filename is None:
            continue
        url = f"{replica_url.rstrip('/')}/slots/{slot}?action={action}"
        error = await _post(transport, url, headers, filename)
        metrics.slot_action(action, error is None)
        if error is not None:
            log.warning(
                f"slot {action} failed",
                replica=replica_id,
                slot=slot,
                file=filename,
                error=error,
            )


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
