"""The keys file (`common.keys`): its format and checks, lookup, reloading; `luftpause keys`."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from luftpause.common.keys import KeyEntry, Keys, KeysError, KeysFile, hash_key, parse_keys
from luftpause.common.keys_cli import main as keys_main

A_KEY, B_KEY = "key-of-team-a", "key-of-team-b"


def entry(name: str, key: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "sha256": hash_key(key), **fields}


def write(path: Path, *entries: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({"keys": list(entries)}))
    return path


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_key_is_stored_as_the_hex_sha256_of_its_text() -> None:
    assert hash_key("abc") == hashlib.sha256(b"abc").hexdigest()
    assert hash_key("  abc\n") == hash_key("abc")  # as read from a terminal or a file


def test_an_entry_has_both_classes_and_no_budget_unless_it_says() -> None:
    keys = parse_keys({"keys": [entry("team-a", A_KEY)]})
    a = keys.named("team-a")
    assert a is not None
    assert a.classes == {"interactive", "batch"} and not a.has_budget and not a.acts_for
    keys = parse_keys(
        {"keys": [entry("team-a", A_KEY, classes=["batch"], daily_tokens=10, acts_for=True)]}
    )
    a = keys.named("team-a")
    assert a is not None and a.classes == {"batch"} and a.daily_tokens == 10 and a.has_budget
    assert a.may_use("batch") and not a.may_use("interactive") and a.acts_for


def test_a_presented_key_is_found_by_its_hash_and_nothing_else_is() -> None:
    keys = parse_keys({"keys": [entry("team-a", A_KEY), entry("team-b", B_KEY)]})
    found = keys.find(A_KEY.encode())
    assert found is not None and found.name == "team-a"
    assert keys.find(b"key-of-team-") is None
    assert keys.find(hash_key(A_KEY).encode()) is None  # the hash is not the key
    assert keys.named("team-c") is None and len(keys) == 2


def test_an_empty_keys_list_is_a_file_where_only_the_operator_token_works() -> None:
    assert len(parse_keys({"keys": []})) == 0


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"keys": [entry("team-a", A_KEY), entry("team-a", B_KEY)]}, "team-a: the name is used"),
        ({"keys": [entry("team-a", A_KEY), entry("team-b", A_KEY)]}, "same sha256 as key team-a"),
        ({"keys": [{"name": "team-a", "sha256": "xyz"}]}, "keys[0] (team-a): 'sha256' must"),
        ({"keys": [{"name": "team-a", "sha256": "ab" * 31}]}, "64 hex digits"),
        ({"keys": [{"name": "team-a"}]}, "'sha256' must be 64 hex digits"),
        ({"keys": [entry("team-a", A_KEY, classes=["urgent"])]}, "unknown classes ['urgent']"),
        ({"keys": [entry("team-a", A_KEY, classes=[])]}, "'classes' must be a non-empty"),
        ({"keys": [entry("team-a", A_KEY, daily_tokens=-1)]}, "daily_tokens must be a whole"),
        ({"keys": [entry("team-a", A_KEY, tokens_per_minute=1.5)]}, "tokens_per_minute must"),
        ({"keys": [entry("team-a", A_KEY, requests_per_minute=True)]}, "requests_per_minute"),
        ({"keys": [entry("team-a", A_KEY, budget=5)]}, "keys[0] (team-a): unknown fields"),
        ({"keys": [entry("team-a", A_KEY, acts_for="yes")]}, "'acts_for' must be true or false"),
        ({"keys": [entry("team/a", A_KEY)]}, "keys[0] (team/a): key name 'team/a' must"),
        ({"keys": [entry("x" * 65, A_KEY)]}, "must be 1 to 64"),
        ({"keys": [entry("", A_KEY)]}, "must be 1 to 64"),
        ({"keys": [{"sha256": hash_key(A_KEY)}]}, "keys[0]: 'name' must be a string"),
        ({"keys": ["team-a"]}, "keys[0] must be a mapping"),
        ({"keys": [], "extra": 1}, "unknown fields ['extra']"),
        ({"entries": []}, "a mapping with a 'keys' list"),
        (None, "a mapping with a 'keys' list"),
    ],
)
def test_a_wrong_file_is_refused_naming_the_entry(raw: Any, message: str) -> None:
    with pytest.raises(KeysError) as caught:
        parse_keys(raw)
    assert message in str(caught.value)


def test_yaml_and_toml_files_load_by_their_extension(tmp_path: Path) -> None:
    write(tmp_path / "keys.yaml", entry("team-a", A_KEY))
    toml = tmp_path / "keys.toml"
    toml.write_text(f'[[keys]]\nname = "team-a"\nsha256 = "{hash_key(A_KEY)}"\n')
    for path in (tmp_path / "keys.yaml", toml):
        found = KeysFile(path).lookup(A_KEY.encode())
        assert found is not None and found.name == "team-a"


def test_a_missing_or_broken_file_at_startup_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(KeysError, match=r"cannot read keys file .*nowhere\.yaml"):
        KeysFile(tmp_path / "nowhere.yaml")
    (tmp_path / "bad.yaml").write_text("keys: [\n")
    with pytest.raises(KeysError, match="cannot parse keys file"):
        KeysFile(tmp_path / "bad.yaml")
    write(tmp_path / "dup.yaml", entry("a", A_KEY), entry("a", B_KEY))
    with pytest.raises(KeysError, match=r"dup.yaml: key a: the name is used twice"):
        KeysFile(tmp_path / "dup.yaml")


def test_a_key_added_to_the_file_is_found_after_the_next_check(tmp_path: Path) -> None:
    clock = Clock()
    path = write(tmp_path / "keys.yaml", entry("team-a", A_KEY))
    keys = KeysFile(path, clock=clock)
    write(path, entry("team-a", A_KEY), entry("team-b", B_KEY, classes=["batch"]))
    assert keys.lookup(B_KEY.encode()) is None  # looked at no more than once a second
    clock.now = 1.0
    found = keys.lookup(B_KEY.encode())
    assert found is not None and found.classes == {"batch"}


def test_a_removed_key_stops_working_after_the_next_check(tmp_path: Path) -> None:
    clock = Clock()
    path = write(tmp_path / "keys.yaml", entry("team-a", A_KEY), entry("team-b", B_KEY))
    keys = KeysFile(path, clock=clock)
    write(path, entry("team-b", B_KEY))
    clock.now = 5.0
    assert keys.lookup(A_KEY.encode()) is None and keys.lookup(B_KEY.encode()) is not None


def test_a_secrets_swapped_symlink_is_followed(tmp_path: Path) -> None:
    """Kubernetes updates a Secret volume by pointing `..data` at a new directory."""
    clock = Clock()
    for version, entries in (("v1", [entry("team-a", A_KEY)]), ("v2", [entry("team-b", B_KEY)])):
        (tmp_path / version).mkdir()
        write(tmp_path / version / "keys.yaml", *entries)
    (tmp_path / "..data").symlink_to("v1")
    (tmp_path / "keys.yaml").symlink_to("..data/keys.yaml")
    keys = KeysFile(tmp_path / "keys.yaml", clock=clock)
    assert keys.lookup(A_KEY.encode()) is not None
    (tmp_path / "..data_tmp").symlink_to("v2")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    clock.now = 1.0
    assert keys.lookup(A_KEY.encode()) is None and keys.lookup(B_KEY.encode()) is not None


def test_a_file_that_breaks_keeps_the_keys_it_had_until_it_is_mended(tmp_path: Path) -> None:
    clock = Clock()
    path = write(tmp_path / "keys.yaml", entry("team-a", A_KEY))
    keys = KeysFile(path, clock=clock)
    path.write_text("keys: [\n")
    clock.now = 1.0
    assert keys.lookup(A_KEY.encode()) is not None
    path.unlink()
    clock.now = 2.0
    assert keys.lookup(A_KEY.encode()) is not None
    write(path, entry("team-b", B_KEY))
    clock.now = 3.0
    assert keys.lookup(A_KEY.encode()) is None and keys.lookup(B_KEY.encode()) is not None


def test_keys_hash_prints_the_sha256_of_stdin() -> None:
    out = io.StringIO()
    assert keys_main(["hash"], stdin=io.StringIO(A_KEY + "\n"), out=out) == 0
    assert out.getvalue().strip() == hash_key(A_KEY)
    assert keys_main(["hash"], stdin=io.StringIO(""), out=io.StringIO()) == 2


def test_keys_new_prints_a_key_once_and_an_entry_that_finds_it() -> None:
    out = io.StringIO()
    assert keys_main(["new", "team-a", "--classes", "batch"], out=out) == 0
    text = out.getvalue()
    key = text.splitlines()[0].rpartition(" ")[2]
    keys = parse_keys({"keys": yaml.safe_load(text.partition("keys file entry:")[2])})
    found = keys.find(key.encode())
    assert found is not None and found.name == "team-a" and found.classes == {"batch"}
    assert keys_main(["new", "team/a"], out=io.StringIO()) == 2


def test_a_made_up_entry_is_built_checked() -> None:
    with pytest.raises(KeysError, match="32 bytes"):
        KeyEntry(name="a", digest=b"short")
    assert Keys((KeyEntry(name="a", digest=bytes(32)),)).named("a") is not None
