"""`luftpause keys`: hash a key for the keys file, or make a new one.

Shell module (stdin, stdout). `hash` reads a key from stdin and prints its SHA-256 in hex, as the
keys file's `sha256` holds it; `new NAME` makes a random key, prints it once (it is stored
nowhere) and the entry to paste into the keys file (`common.keys`).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from typing import TextIO

import yaml

from luftpause.common.keys import CLASSES, KeyEntry, KeysError, hash_key

KEY_BYTES = 32


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="luftpause keys", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("hash", help="print the SHA-256 of the key read from stdin")
    new = commands.add_parser("new", help="make a key for NAME: the key, then its entry")
    new.add_argument("name", help="the caller the key is (its name in the keys file)")
    new.add_argument(
        "--classes",
        default=",".join(CLASSES),
        help="the classes it may use, comma-separated (default: interactive,batch)",
    )
    return parser


def entry_yaml(name: str, digest: str, classes: list[str]) -> str:
    """The keys file entry for a key, as YAML to paste under `keys:`."""
    return "\n".join(
        [
            f"  - name: {_scalar(name)}",
            f'    sha256: "{digest}"',
            f"    classes: [{', '.join(classes)}]",
            "    # tokens_per_minute: 0     # optional budgets; 0 or absent: none",
            "    # requests_per_minute: 0",
            "    # daily_tokens: 0",
        ]
    )


def _scalar(text: str) -> str:
    """`text` as a YAML string: bare when YAML reads it back as that string, else quoted."""
    return text if yaml.safe_load(text) == text else json.dumps(text)


def new_key(name: str, classes: list[str], out: TextIO) -> None:
    """Print a fresh key and its entry; `KeysError` for a bad name or class."""
    key = f"lp-{secrets.token_urlsafe(KEY_BYTES)}"
    digest = hash_key(key)
    KeyEntry(name=name, digest=bytes.fromhex(digest), classes=frozenset(classes))
    print(f"key (shown once, give it to {name}): {key}", file=out)
    print("\nkeys file entry:\n", file=out)
    print(entry_yaml(name, digest, classes), file=out)


def main(argv: list[str], stdin: TextIO | None = None, out: TextIO | None = None) -> int:
    """Entry point for `luftpause keys`."""
    args = build_parser().parse_args(argv)
    out = out or sys.stdout
    if args.command == "hash":
        key = (stdin or sys.stdin).read().strip()
        if not key:
            print("luftpause keys hash: no key on stdin", file=sys.stderr)
            return 2
        print(hash_key(key), file=out)
        return 0
    try:
        new_key(args.name, [c.strip() for c in args.classes.split(",") if c.strip()], out)
    except KeysError as exc:
        print(f"luftpause keys new: {exc}", file=sys.stderr)
        return 2
    return 0
