"""Reading the YAML or TOML files the services are configured by (endpoints, keys, prices)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml


def load_structured(path: str | Path, what: str, error: type[Exception]) -> Any:
    """The parsed content of a YAML file, or a TOML one if its name ends in `.toml`. A file that
    cannot be read or parsed raises `error` with a message naming it as `what` ("config",
    "keys file") and saying why."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what} {p}: {exc}") from exc
    try:
        return tomllib.loads(text) if p.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise error(f"cannot parse {what} {p}: {exc}") from exc
