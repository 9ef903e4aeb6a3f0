"""The run bundle: round trip, checksum, version, format and corruption. Pure, no event loop."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause.runtime.core import bundle as b
from luftpause.runtime.core import forks
from luftpause.runtime.core import journal as j
from luftpause.runtime.core import machine as m
from tests.runtime.test_forks import SPEC, fork_of, one_round, source_after_one_round


def records() -> list[dict[str, Any]]:
    """A run after one round, and a fork of it (one line, a batch) with one round of its own."""
    source, recs = source_after_one_round()
    fork = fork_of(source, "run-f", "be bold")
    _, later = one_round(forks.begin(fork), call_id="f1")
    return [*recs, forks.batch_record([fork]), *later]


def text(**changes: Any) -> str:
    """A bundle of run-1 with `changes` to its fields, checksummed as if exported so."""
    body = b.make("run-1", [r for r in records() if r["run"] == "run-1"]).body()
    body |= changes
    return json.dumps(body | {b.CHECKSUM: b.checksum(body)})


def test_a_bundle_round_trips_with_its_runs_at_their_rounds() -> None:
    made = b.make("run-f", [r for r in forks.expand(records()) if r["run"] == "run-f"], 5.0)
    back = b.decode(b.encode(made))
    assert back == made
    assert back.runs == ({"handle": "run-f", "state": "running", "round": 2},)
    assert back.records[0]["type"] == "forked"  # a fork's bundle stands alone


def test_a_bundle_is_versioned_named_and_checksummed_over_its_canonical_encoding() -> None:
    doc = json.loads(b.encode(b.make("run-1", records())))
    assert (doc["format"], doc["version"]) == ("luftpause-run-bundle", 1)
    body = {k: v for k, v in doc.items() if k != "sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert doc["sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    assert [r["handle"] for r in doc["runs"]] == ["run-1", "run-f"]


def test_whitespace_and_key_order_do_not_matter_and_base64_is_taken() -> None:
    made = b.make("run-1", records())
    doc = json.loads(b.encode(made))
    pretty = json.dumps(dict(reversed(list(doc.items()))), indent=3)
    assert b.decode(pretty) == made
    assert b.decode(base64.b64encode(pretty.encode()).decode()) == made
    assert b.decode(pretty.encode()) == made


def test_a_newer_version_is_refused_before_anything_else_is_read() -> None:
    with pytest.raises(b.BundleError, match="newer") as err:
        b.decode(json.dumps({"format": b.FORMAT, "version": 2, "whatever": True}))
    assert err.value.code == "bundle_version"


@pytest.mark.parametrize(
    ("data", "code"),
    [
        ("", "bundle_malformed"),
        ("{not json", "bundle_malformed"),
        ("[1, 2]", "bundle_malformed"),
        ("not base64 either!", "bundle_malformed"),
        ('{"format": "zip"}', "bundle_format"),
        (json.dumps({"format": b.FORMAT, "version": "1"}), "bundle_malformed"),
        (json.dumps({"format": b.FORMAT, "version": 0}), "bundle_malformed"),
        (json.dumps({"format": b.FORMAT, "version": 1}), "bundle_corrupt"),
    ],
)
def test_what_is_not_a_bundle_is_refused_with_its_reason(data: str, code: str) -> None:
    with pytest.raises(b.BundleError) as err:
        b.decode(data)
    assert err.value.code == code


def test_a_changed_value_is_caught_by_the_checksum() -> None:
    doc = json.loads(b.encode(b.make("run-1", records())))
    doc["records"][1]["results"][0]["content"] = "forged"
    with pytest.raises(b.BundleError, match="corrupt"):
        b.decode(json.dumps(doc))


@pytest.mark.parametrize(
    "changes",
    [
        {"records": []},
        {"runs": [{"handle": "run-1", "state": "running", "round": 7}]},
        {"runs": [{"handle": "run-1", "state": "running", "round": 1}, {"handle": "run-2"}]},
        {"root": "run-9"},
        {"records": [{"v": 2, "type": "spawned", "run": "run-1"}]},
        {"records": [{"v": 1, "type": "batch", "run": "run-1", "records": []}]},
        {"records": [{"v": 1, "type": "spawned", "run": "run-1", "spec": {"handle": "x"}}]},
    ],
)
def test_a_bundle_whose_records_do_not_resume_what_it_names_is_refused(
    changes: dict[str, Any],
) -> None:
    """Checksummed correctly, yet not what an export makes: refused all the same."""
    with pytest.raises(b.BundleError) as err:
        b.decode(text(**changes))
    assert err.value.code == "bundle_malformed"


def test_records_of_a_run_the_bundle_does_not_name_are_refused() -> None:
    body = b.make("run-1", [r for r in records() if r["run"] == "run-1"]).body()
    body["records"].append({**body["records"][1], "run": "run-other"})
    data = json.dumps(body | {b.CHECKSUM: b.checksum(body)})
    with pytest.raises(b.BundleError, match="does not name"):
        b.decode(data)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_one_character_changed_is_refused_or_reads_the_same(data: st.DataObject) -> None:
    """Invariant: a bundle damaged anywhere is never read as a different bundle: it is refused
    (checksum, JSON, format) or, when the change was only whitespace, read as it was."""
    made = b.make("run-1", records())
    encoded = b.encode(made)
    at = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    char = data.draw(st.characters(codec="utf-8", exclude_characters=encoded[at]))
    damaged = encoded[:at] + char + encoded[at + 1 :]
    try:
        back = b.decode(damaged)
    except b.BundleError:
        return
    assert back == made


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.text(max_size=30), min_size=0, max_size=4),
    st.floats(min_value=0, max_value=1e9, allow_nan=False),
)
def test_any_fork_history_round_trips(instructions: list[str], at: float) -> None:
    """Invariant: whatever its source said and whenever exported, a bundle decodes to itself
    and its runs replay to the states the live runs had."""
    source, recs = source_after_one_round()
    spec = m.RunSpec(handle="run-1", task="".join(instructions) or "t", model="sim")
    fork_records = [
        forks.forked_record(forks.fork_spec(SPEC, f"fork-{i}", at), source, text_)
        for i, text_ in enumerate(instructions)
    ]
    all_records = [j.spawned_record(spec), *recs[1:], *fork_records]
    made = b.make("run-1", all_records, at)
    assert b.decode(b.encode(made)) == made
    live = {r["run"]: forks.begin(r) for r in fork_records}
    replayed = j.replay(made.records).runs
    assert all(m.canonical(replayed[h]) == m.canonical(s) for h, s in live.items())
