"""Every flag of every subcommand settable by a `LUFTPAUSE_*` variable (`common.envargs`)."""

from __future__ import annotations

import argparse
import importlib
import subprocess
from pathlib import Path
from typing import Any

import pytest

from luftpause.cli import SUBCOMMANDS
from luftpause.common import envargs
from luftpause.dataplane.main import parse_args as dataplane_args
from luftpause.runtime.main import parse_args as runtime_args
from luftpause.scheduler.main import parse_args as scheduler_args
from luftpause.testkit.engine.main import parse_args as engine_args
from luftpause.testkit.fakemcp.server import parse_args as fake_mcp_args
from luftpause.testkit.loadgen_cli import parse_args as loadgen_args
from luftpause.testkit.procs import luftpause_exe
from luftpause.up import parse_args as up_args

# The module whose `build_parser()` is each subcommand's command line.
PARSERS = {
    "scheduler": "luftpause.scheduler.main",
    "dataplane": "luftpause.dataplane.main",
    "runtime": "luftpause.runtime.main",
    "fake-engine": "luftpause.testkit.engine.main",
    "fake-mcp": "luftpause.testkit.fakemcp.server",
    "llama-engine": "luftpause.testkit.llamacpp",
    "loadgen": "luftpause.testkit.loadgen_cli",
    "up": "luftpause.up",
}
# Subcommands that are tools run by hand, not processes: no option a variable could set.
TOOLS = {"keys": "luftpause.common.keys_cli"}


def parser_of(name: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = importlib.import_module(PARSERS[name]).build_parser()
    return parser


# Options whose values are not numbers or words of a list: a text each takes.
TEXTS = {
    "priority": "interactive=0,batch=100",
    "without": "openings,kv_rule",
    "with_rules": "headroom",
    "reply_reserve": "0.5",
}
# Repeatable options whose values are not numbers: the items a variable lists.
ITEMS = {"send_priority": ("interactive=0", "batch=100")}


def sample(action: argparse.Action) -> tuple[str, Any]:
    """A variable's text for the option and the value it must give."""
    if action.dest in TEXTS and action.type is not None:
        text = TEXTS[action.dest]
        return text, action.type(text)  # type: ignore[operator]
    if isinstance(action, argparse._StoreConstAction):
        return "yes", action.const
    if isinstance(action, argparse._AppendAction):
        if action.dest in ITEMS and action.type is not None:
            items = ITEMS[action.dest]
            return ",".join(items), [*(action.default or []), *map(action.type, items)]  # type: ignore[arg-type]
        if action.type is not None:  # numbers, or what the type reads from numbers
            convert = action.type
            return "7,8", [*(action.default or []), convert("7"), convert("8")]  # type: ignore[operator]
        return "a,b", [*(action.default or []), "a", "b"]
    if action.choices is not None:
        choice = next(c for c in action.choices if c != action.default)
        return str(choice), choice
    if action.type is float:
        return "0.5", 0.5
    if action.type is not None:
        return "7", action.type("7")  # type: ignore[operator]
    return "from-env", "from-env"


def test_the_variable_is_the_long_option_upper_case_with_underscores() -> None:
    assert envargs.env_name("--grpc-port") == "LUFTPAUSE_GRPC_PORT"
    assert envargs.env_name("--state-dir") == "LUFTPAUSE_STATE_DIR"
    assert envargs.env_name("--no-local-placement") == "LUFTPAUSE_NO_LOCAL_PLACEMENT"


def test_every_subcommand_has_its_command_line_listed_here() -> None:
    assert set(PARSERS) | set(TOOLS) == set(SUBCOMMANDS)


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_a_tool_has_no_long_option_a_variable_would_miss(name: str) -> None:
    parser: argparse.ArgumentParser = importlib.import_module(TOOLS[name]).build_parser()
    assert [var for _, var in envargs.options(parser)] == []


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_long_option_of_every_subcommand_takes_its_value_from_its_variable(
    name: str,
) -> None:
    parser = parser_of(name)
    options = envargs.options(parser)
    longs = {
        a.dest
        for a in parser._actions
        if any(s.startswith("--") for s in a.option_strings) and a.help is not argparse.SUPPRESS
    }
    assert {a.dest for a, _ in options} == longs - {"help"}  # internal options have none
    for action, var in options:
        text, expected = sample(action)
        namespace = envargs.parse_args(parser_of(name), [], {var: text})
        assert getattr(namespace, action.dest) == expected, var


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_help_names_each_options_variable(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = parser_of(name)
    variables = [var for _, var in envargs.options(parser)]
    with pytest.raises(SystemExit) as exit_:
        envargs.parse_args(parser, ["--help"], {})
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # the help wraps long lines
    for var in variables:
        assert var in text


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_a_flag_on_the_command_line_beats_the_variable(name: str) -> None:
    parser = parser_of(name)
    action, var = next(
        (a, v) for a, v in envargs.options(parser) if isinstance(a, argparse._StoreAction)
    )
    flag = next(s for s in action.option_strings if s.startswith("--"))
    text, expected = sample(action)
    namespace = envargs.parse_args(parser_of(name), [flag, text], {var: "not-a-good-value"})
    assert getattr(namespace, action.dest) == expected


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_a_bad_value_is_a_usage_error_naming_the_variable(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = parser_of(name)
    var = next(
        v
        for a, v in envargs.options(parser)
        if isinstance(a, argparse._StoreAction) and a.type in (int, float)
    )
    with pytest.raises(SystemExit) as exit_:
        envargs.parse_args(parser, [], {var: "twelve"})
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"error: environment variable {var}: invalid" in err and "'twelve'" in err


def test_flags_without_a_value_read_yes_and_no_words_in_any_case() -> None:
    for word in ("1", "true", "YES", "On"):
        assert not dataplane_args([], {"LUFTPAUSE_NO_LOCAL_PLACEMENT": word}).local_placement
    for word in ("0", "false", "No", "OFF"):
        assert dataplane_args([], {"LUFTPAUSE_NO_LOCAL_PLACEMENT": word}).local_placement
    with pytest.raises(SystemExit) as exit_:
        dataplane_args([], {"LUFTPAUSE_NO_LOCAL_PLACEMENT": "maybe"})
    assert exit_.value.code == 2


def test_a_choice_is_checked_against_the_options_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert engine_args([], {"LUFTPAUSE_ADMISSION": "sglang"}).admission == "sglang"
    with pytest.raises(SystemExit) as exit_:
        engine_args([], {"LUFTPAUSE_ADMISSION": "greedy"})
    assert exit_.value.code == 2
    assert "environment variable LUFTPAUSE_ADMISSION: invalid choice: 'greedy'" in (
        capsys.readouterr().err
    )


def test_an_empty_variable_counts_as_unset() -> None:
    assert scheduler_args([], {"LUFTPAUSE_GRPC_PORT": ""}).grpc_port == 5000


def test_the_older_names_still_work_and_the_new_name_wins_over_them() -> None:
    old = {
        "LUFTPAUSE_SCHEDULER_GRPC_PORT": "6000",
        "LUFTPAUSE_SCHEDULER_HTTP_PORT": "6001",
        "LUFTPAUSE_CONFIG": "/etc/luftpause/endpoints.yaml",
        "LUFTPAUSE_HOST": "0.0.0.0",
    }
    args = scheduler_args([], old)
    assert (args.grpc_port, args.http_port) == (6000, 6001)
    assert (args.config, args.host) == ("/etc/luftpause/endpoints.yaml", "0.0.0.0")
    assert scheduler_args([], {**old, "LUFTPAUSE_GRPC_PORT": "7000"}).grpc_port == 7000
    assert dataplane_args([], {"LUFTPAUSE_DATAPLANE_PORT": "9090"}).port == 9090
    assert dataplane_args([], {"LUFTPAUSE_SCHEDULER": "sched:5000"}).scheduler == "sched:5000"
    assert runtime_args([], {"LUFTPAUSE_STATE_DIR": "/var/lib/lp"}).state_dir == Path("/var/lib/lp")


def test_each_subcommand_reads_its_variables_through_its_own_parse_path() -> None:
    env = {"LUFTPAUSE_PORT": "4321", "LUFTPAUSE_HOST": "0.0.0.0"}
    assert (scheduler_args([], env).host, dataplane_args([], env).port) == ("0.0.0.0", 4321)
    runtime = runtime_args(
        [],
        {
            **env,
            "LUFTPAUSE_MCP_SERVER": "http://a/mcp, http://b/mcp",
            "LUFTPAUSE_MCP_STDIO": "tool-a --x 1,2\ntool-b",
        },
    )
    assert runtime.port == 4321
    assert runtime.mcp_servers == ("http://a/mcp", "http://b/mcp")
    assert runtime.mcp_stdio == ("tool-a --x 1,2", "tool-b")
    assert engine_args([], env).port == 4321
    assert fake_mcp_args([], {**env, "LUFTPAUSE_SEED": "3"}).seed == 3
    workload = loadgen_args([], {"LUFTPAUSE_BATCH": "2", "LUFTPAUSE_STOP": "a,b\n</x>"})
    assert (workload.batch, workload.stop) == (2, ("a,b", "</x>"))
    assert up_args([], {"LUFTPAUSE_ENGINE_PROFILE": "cpu"}).engine_profile == "cpu"


def test_a_repeated_flag_on_the_command_line_replaces_the_variables_list() -> None:
    runtime = runtime_args(["--mcp-server", "http://c/mcp"], {"LUFTPAUSE_MCP_SERVER": "http://a"})
    assert runtime.mcp_servers == ("http://c/mcp",)


def test_a_bad_variable_ends_the_process_with_usage_and_no_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        [luftpause_exe(), "dataplane"],
        env={"LUFTPAUSE_PORT": "eighty", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("usage: luftpause dataplane")
    assert "environment variable LUFTPAUSE_PORT: invalid int value: 'eighty'" in done.stderr
    assert "Traceback" not in done.stderr
