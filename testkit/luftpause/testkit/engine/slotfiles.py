"""llama.cpp's slot save and restore (`POST /slots/{id}?action=save|restore`), as the simulator
answers them with `--slot-saves`.

Pure module. The simulator keeps no KV per slot (its prefix cache is the pool's), so a save
records the file and a restore checks that it exists; the answers and errors are llama.cpp's
(checked against the `xllamacpp` build: 400 for a bad action, a bad name or a missing file).
"""

from __future__ import annotations

from typing import Any

from luftpause.testkit.engine.parsing import HttpError

NOT_ENABLED = "This server does not support slots action. Start it with `--slot-save-path`"


class SlotFiles:
    """The save files written so far, by name: the slot each was saved from."""

    def __init__(self) -> None:
        self.files: dict[str, int] = {}

    def act(self, action: str, slot: int, filename: Any) -> dict[str, Any]:
        """llama.cpp's answer to `action` on `slot` with `filename`; HttpError as it refuses."""
        if action not in ("save", "restore"):
            raise HttpError(400, "Invalid action")
        if not isinstance(filename, str) or not valid_filename(filename):
            raise HttpError(400, "Invalid filename")
        if action == "save":
            self.files[filename] = slot
            return {"id_slot": slot, "filename": filename, "n_saved": 0}
        if filename not in self.files:
            raise HttpError(
                400,
                "Unable to restore slot: No available space in KV cache or invalid slot save file",
            )
        return {"id_slot": slot, "filename": filename, "n_restored": 0}


def valid_filename(name: str) -> bool:
    """A bare file name, as llama.cpp's `fs_validate_filename` wants (the common part)."""
    return 0 < len(name) <= 255 and not any(c in name for c in '/\\:*?"<>|') and ".." not in name
