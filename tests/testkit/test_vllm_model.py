"""testkit.vllm_model: a converted folder counts as ready only once its check passed, in this
format (the conversion itself needs the vLLM venv: `make vllm`)."""

from __future__ import annotations

import json
from pathlib import Path

from luftpause.testkit.vllm_model import FORMAT, MARKER, ready


def test_a_folder_is_ready_only_with_a_marker_of_this_format(tmp_path: Path) -> None:
    assert not ready(tmp_path / "missing")
    assert not ready(tmp_path)
    (tmp_path / MARKER).write_text("{not json")
    assert not ready(tmp_path)
    (tmp_path / MARKER).write_text(json.dumps({"format": FORMAT - 1}))
    assert not ready(tmp_path)
    (tmp_path / MARKER).write_text(json.dumps({"format": FORMAT, "check": {"answer": "..."}}))
    assert ready(tmp_path)
