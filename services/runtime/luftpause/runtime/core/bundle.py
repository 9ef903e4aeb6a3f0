"""The run bundle: runs carried from one runtime to another as one versioned, checksummed
JSON document (what `export` gives and `import` takes).

Pure module: no I/O, no clock reads; imports `journal` (whose records a bundle carries and
whose replay checks them) and `forks`. A bundle::

    {"format": "luftpause-run-bundle", "version": 1, "exportedAt": T, "root": H,
     "runs": [{"handle": H, "state": "running", "round": N}, ...],
     "records": [the runs' journal records, in journal order, batches taken apart],
     "sha256": "<hex>"}

`runs` names every run the bundle carries (the root first, then its subtree when exported
whole) with the state and the complete rounds its records replay to: where it resumes.
`records` are exactly the journal records of those runs, so an import appends them to its own
journal and the runs replay there as they did here; a fork's records begin with its `forked`
record, which needs nothing of its source's. `sha256` is the SHA-256 of the canonical
encoding of every other field: JSON with sorted keys, no whitespace, non-ASCII as UTF-8.

`decode` refuses (`BundleError`, with its `code`) anything it cannot resume as promised:
text that is not JSON or not a bundle object (`bundle_malformed`), another `format`
(`bundle_format`), a newer `version` (`bundle_version`), a checksum that does not match
(`bundle_corrupt`), and records that do not replay to the runs it names (`bundle_malformed`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from luftpause.runtime.core import forks, journal
from luftpause.runtime.core.errors import BundleError

FORMAT = "luftpause-run-bundle"
VERSION = 1
CHECKSUM = "sha256"
MAX_BYTES = 64 * 1024 * 1024  # larger bundles are refused before they are parsed


@dataclass(frozen=True, slots=True, kw_only=True)
class Bundle:
    """Runs with the journal records that resume them, as `export` made them."""

    root: str
    runs: tuple[dict[str, Any], ...]
    records: tuple[dict[str, Any], ...]
    exported_at: float = 0.0

    def __post_init__(self) -> None:
        handles = [r["handle"] for r in self.runs]
        if not handles or handles[0] != self.root or len(set(handles)) != len(handles):
            raise ValueError("a bundle's runs are distinct handles, its root first")

    @property
    def handles(self) -> tuple[str, ...]:
        return tuple(r["handle"] for r in self.runs)

    def body(self) -> dict[str, Any]:
        """Every field but the checksum."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "exportedAt": self.exported_at,
            "root": self.root,
            "runs": [dict(r) for r in self.runs],
            "records": list(self.records),
        }


def canonical(body: dict[str, Any]) -> bytes:
    """The bytes the checksum is taken over."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(body)).hexdigest()


def make(root: str, records: Iterable[dict[str, Any]], exported_at: float = 0.0) -> Bundle:
    """The bundle of `root` and the runs of `records` (batches taken apart), checked by replay."""
    flat = list(forks.expand(records))
    replayed = journal.replay(flat)
    order = [root] + [h for h in replayed.runs if h != root]
    runs = tuple(_entry(h, replayed.runs[h]) for h in order)
    return Bundle(root=root, runs=runs, records=tuple(flat), exported_at=exported_at)


def _entry(handle: str, state: Any) -> dict[str, Any]:
    return {"handle": handle, "state": state.phase.value, "round": state.rounds}


def encode(bundle: Bundle) -> str:
    """The bundle as JSON text, its checksum last."""
    body = bundle.body()
    return json.dumps(body | {CHECKSUM: checksum(body)}, ensure_ascii=False)


def decode(data: str | bytes) -> Bundle:
    """A bundle from its JSON text (or that text in base64); `BundleError` if refused."""
    doc = _parse(data)
    if doc.get("format") != FORMAT:
        raise BundleError("bundle_format", f"not a {FORMAT} (format {doc.get('format')!r})")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise BundleError("bundle_malformed", f"bundle version {version!r} is not a version")
    if version > VERSION:
        raise BundleError(
            "bundle_version",
            f"bundle version {version} is newer than this runtime reads ({VERSION}): "
            "import it with a newer luftpause",
        )
    body = {k: v for k, v in doc.items() if k != CHECKSUM}
    if doc.get(CHECKSUM) != checksum(body):
        raise BundleError(
            "bundle_corrupt", "bundle checksum does not match its content: it is corrupt"
        )
    try:
        return _checked(doc)
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(
            "bundle_malformed", f"bundle does not hold resumable runs: {exc}"
        ) from exc


def _parse(data: str | bytes) -> dict[str, Any]:
    if not isinstance(data, str | bytes):
        raise BundleError("bundle_malformed", "a bundle is JSON text")
    if len(data) > MAX_BYTES:
        raise BundleError("bundle_malformed", f"bundle larger than {MAX_BYTES} bytes")
    text = data.strip()
    if text and text[:1] not in ("{", b"{"):
        try:
            text = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise BundleError("bundle_malformed", "bundle is neither JSON nor base64") from None
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BundleError("bundle_malformed", f"bundle is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BundleError("bundle_malformed", "bundle is not a JSON object")
    return doc


def _checked(doc: dict[str, Any]) -> Bundle:
    """The bundle, once its records are known records of its runs that replay to them."""
    records = doc["records"]
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError("records must be a list of objects")
    claimed = Bundle(
        root=str(doc["root"]),
        runs=tuple(_claim(r) for r in doc["runs"]),
        records=tuple(records),
        exported_at=float(doc.get("exportedAt") or 0.0),
    )
    handles = set(claimed.handles)
    for r in records:
        if r.get("v") not in journal.READS or not isinstance(r.get("type"), str):
            raise ValueError(f"record {r.get('type')!r} of version {r.get('v')!r}")
        if r["type"] == "batch":
            raise ValueError("a bundle's records are plain records (no batch)")
        if r.get("run") not in handles:
            raise ValueError(f"record of run {r.get('run')!r}, which the bundle does not name")
    try:
        replayed = journal.replay(records)
    except journal.JournalError as exc:
        raise ValueError(str(exc)) from exc
    for entry in claimed.runs:
        state = replayed.runs.get(entry["handle"])
        if state is None or _entry(entry["handle"], state) != entry:
            raise ValueError(f"run {entry['handle']} does not replay to {entry}")
    return claimed


def _claim(entry: Any) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise ValueError("each of runs must be an object")
    return {"handle": str(entry["handle"]), "state": str(entry["state"]), "round": entry["round"]}
