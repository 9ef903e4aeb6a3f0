"""Every long option of a command line also settable by an environment variable.

Pure module: no I/O beyond reading the environ mapping it is given. It does write each option's
help text, once, so `--help` names the variable beside the option.

    --grpc-port           LUFTPAUSE_GRPC_PORT
    --state-dir           LUFTPAUSE_STATE_DIR
    --no-local-placement  LUFTPAUSE_NO_LOCAL_PLACEMENT

The name is `LUFTPAUSE_` and the first long option string without its dashes, upper case, inner
dashes as underscores. A flag on the command line beats the variable, and the variable beats
the option's default; an empty variable counts as unset. What the variable holds:

- an option with a value: that value, converted with the option's `type` and checked against
  its `choices`, as if it had been given on the command line;
- a flag without a value (`store_true`, `store_false`, `store_const`): 1/true/yes/on (any case)
  gives the flag, 0/false/no/off leaves the default;
- a repeatable option (`append`): its values separated by commas, or by the option's own
  separator (`separators`, say a newline for whole command lines).

A value that does not convert is a usage error naming the variable (`parser.error`: the usage
line, one message, exit 2, no traceback). It is checked only when the command line does not
give the option, so a flag can always correct a bad variable. Older names stay readable as
`aliases`, consulted in order when the variable of the option's own name is unset.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

PREFIX = "LUFTPAUSE_"
TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})
EPILOG = (
    "Every option can also be set by the environment variable named in its help; "
    "a flag on the command line wins."
)
_SKIPPED = (argparse._HelpAction, argparse._VersionAction)


class _FromEnv(list[Any]):
    """Marks an option the environment may set; argparse copies it before appending."""


def env_name(option: str) -> str:
    """`--grpc-port` -> `LUFTPAUSE_GRPC_PORT`."""
    return PREFIX + option.lstrip("-").upper().replace("-", "_")


def options(parser: argparse.ArgumentParser) -> list[tuple[argparse.Action, str]]:
    """Each long option that takes part, with its variable, in the parser's order."""
    out: list[tuple[argparse.Action, str]] = []
    seen: set[str] = set()
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or isinstance(action, _SKIPPED) or action.dest in seen:
            continue
        if action.help is argparse.SUPPRESS:
            continue  # an internal option (one process passing it to another): no variable
        seen.add(action.dest)
        out.append((action, env_name(longs[0])))
    return out


def parse_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    environ: Mapping[str, str],
    *,
    aliases: Mapping[str, Sequence[str]] | None = None,
    separators: Mapping[str, str] | None = None,
) -> argparse.Namespace:
    """`parser.parse_args(argv)` with the defaults the environment gives."""
    return _parse(parser, argv, environ, aliases or {}, separators or {}, known=False)[0]


def parse_known_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    environ: Mapping[str, str],
    *,
    aliases: Mapping[str, Sequence[str]] | None = None,
    separators: Mapping[str, str] | None = None,
) -> tuple[argparse.Namespace, list[str]]:
    """`parser.parse_known_args(argv)` with the defaults the environment gives."""
    return _parse(parser, argv, environ, aliases or {}, separators or {}, known=True)


def _parse(
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    environ: Mapping[str, str],
    aliases: Mapping[str, Sequence[str]],
    separators: Mapping[str, str],
    *,
    known: bool,
) -> tuple[argparse.Namespace, list[str]]:
    found = []
    for action, var in options(parser):
        names = (var, *aliases.get(var, ()))
        separator = separators.get(var, ",")
        _document(parser, action, names, separator)
        present = next(((n, environ[n]) for n in names if environ.get(n, "").strip()), None)
        if present is not None:
            marker = _FromEnv() if isinstance(action, argparse._AppendAction) else object()
            found.append((action, present, separator, marker))
    namespace = argparse.Namespace(**{action.dest: marker for action, _, _, marker in found})
    rest: list[str] = []
    if known:
        namespace, rest = parser.parse_known_args(argv, namespace)
    else:
        namespace = parser.parse_args(argv, namespace)
    for action, (var, raw), separator, marker in found:
        value = getattr(namespace, action.dest)
        if value is marker:  # not on the command line
            try:
                value = convert(action, raw, separator)
            except ValueError as exc:
                parser.error(f"environment variable {var}: {exc}")
        setattr(namespace, action.dest, list(value) if isinstance(value, _FromEnv) else value)
    return namespace, rest


def convert(action: argparse.Action, raw: str, separator: str = ",") -> Any:
    """The option's value from a variable's text; ValueError says what is wrong with it."""
    if isinstance(action, argparse._StoreConstAction):
        word = raw.strip().lower()
        if word in TRUE:
            return action.const
        if word in FALSE:
            return action.default
        raise ValueError(f"not a yes or no: {raw!r} (use 1/true/yes/on or 0/false/no/off)")
    if isinstance(action, argparse._AppendAction):
        parts = [p.strip() for p in raw.split(separator)]
        return [*(action.default or ()), *(_one(action, p) for p in parts if p)]
    if isinstance(action, argparse._StoreAction):
        return _one(action, raw.strip())
    raise ValueError(f"{type(action).__name__} options cannot come from the environment")


def _one(action: argparse.Action, text: str) -> Any:
    kind = action.type
    try:
        value = kind(text) if callable(kind) else text
    except argparse.ArgumentTypeError as exc:
        raise ValueError(str(exc)) from None
    except (TypeError, ValueError):
        name = getattr(kind, "__name__", repr(kind))
        raise ValueError(f"invalid {name} value: {text!r}") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(repr(c) for c in action.choices)
        raise ValueError(f"invalid choice: {value!r} (choose from {choices})")
    return value


def _document(
    parser: argparse.ArgumentParser,
    action: argparse.Action,
    names: Sequence[str],
    separator: str,
) -> None:
    """Name the variable in the option's help (once), and say the rule in the epilog."""
    if action.help == argparse.SUPPRESS or (action.help and f"env {names[0]}" in action.help):
        return
    how = " or ".join(names)
    if isinstance(action, argparse._AppendAction):
        how += ", one per line" if separator == "\n" else f", {separator}-separated"
    action.help = f"{action.help}; env {how}" if action.help else f"env {how}"
    if not parser.epilog:
        parser.epilog = EPILOG
