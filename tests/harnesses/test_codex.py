"""Codex, the real program at its pinned version, through both of luftpause's doors.

Its own loop goes through the dataplane's `/v1/responses` (translated to the simulated engines'
Chat Completions, or passed to engines serving the Responses API); with the runtime as its MCP
server (its tools arrive in Codex's request as a namespace) it spawns sub-agents and awaits
them. The simulated model follows a script of replies; each session runs in a home of its own.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from luftpause.testkit.harnesses import Codex, HarnessStack
from luftpause.testkit.status import fetch_status
from tests.harnesses.runtime import results

pytestmark = pytest.mark.asyncio(loop_scope="module")

NOTE = "The Rhine is 1,233 km long."
SHELL_SESSION = {
    "offers": ["exec_command"],
    "replies": [
        {"calls": [{"name": "exec_command", "arguments": {"cmd": "ls"}}]},
        {"calls": [{"name": "exec_command", "arguments": {"cmd": "cat notes.txt"}}]},
        {"text": ["The note says: ", {"$results": True}]},
    ],
}


@pytest.mark.parametrize("door", ["translated", "passed"])
async def test_codexs_own_loop_runs_shell_commands_as_one_run_on_one_replica(
    stack: HarnessStack, tmp_path: Path, door: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text(NOTE + "\n")
    await stack.script(SHELL_SESSION)
    await stack.reset()
    before = (await fetch_status(stack.scheduler_status))["runs_total"]
    url = stack.dataplane if door == "translated" else stack.native
    codex = Codex(base_url=url, home=tmp_path / "home", api_key=stack.token)
    codex.configure()
    async with asyncio.timeout(120):
        ran = await codex.run("List the files, then read the note.", cwd=work, timeout=90)
    assert ran.returncode == 0, ran.stderr[-2000:]
    # The last reply quotes the shell's output: `cat` ran in the directory, and its output
    # came back as the call's function_call_output.
    assert "The note says:" in ran.stdout and NOTE in ran.stdout
    assert "notes.txt" in ran.stderr  # the `ls` Codex printed as it ran it
    per_engine = await stack.requests()
    assert sorted(len(seen) for seen in per_engine) == [0, 3]
    path = "/v1/chat/completions" if door == "translated" else "/v1/responses"
    assert {r["path"] for seen in per_engine for r in seen} == {path}
    after = await fetch_status(stack.scheduler_status)
    assert after["runs_total"] == before + 1 and after["turns_in_flight"] == 0


async def test_codex_spawns_sub_agents_over_mcp_and_awaits_them_in_one_call(
    stack: HarnessStack, tmp_path: Path
) -> None:
    spawn = [
        {
            "name": "mcp__luftpause__spawn",
            "arguments": {"task": f"How long is the {r}?", "tools": ["lookup"]},
        }
        for r in ("Elbe", "Oder")
    ]
    wait = {"handles": {"$collect": "handle"}, "timeout": 50}
    await stack.script(
        {
            "offers": ["mcp__luftpause__spawn"],
            "replies": [
                {"calls": spawn},
                {"calls": [{"name": "mcp__luftpause__await", "arguments": wait}]},
                {"text": ["The answers: ", {"$collect": "result"}]},
            ],
        }
    )
    codex = Codex(base_url=stack.dataplane, home=tmp_path / "home", api_key=stack.token)
    codex.configure({"luftpause": stack.mcp}, mcp_token_env="LUFTPAUSE_TOKEN")
    known = {run["handle"] for run in await stack.runs()}
    async with asyncio.timeout(120):
        ran = await codex.run(
            "Look up two rivers with sub-agents.",
            cwd=tmp_path,
            extra_env={"LUFTPAUSE_TOKEN": stack.token},
            timeout=90,
        )
        assert ran.returncode == 0, ran.stderr[-2000:]
        spawned = [run for run in await stack.runs() if run["handle"] not in known]
        answers = await results(stack, [run["handle"] for run in spawned])
    assert len(spawned) == 2 and all(run["state"] == "finished" for run in spawned)
    # Codex says what it calls: two spawns, then one await.
    calls = [line for line in ran.stderr.splitlines() if line.endswith(" started")]
    assert calls == ["mcp: luftpause/spawn started"] * 2 + ["mcp: luftpause/await started"]
    quoted = ran.stdout.strip().removeprefix("The answers: ").split("; ")
    assert sorted(quoted) == sorted(answers) and all(answers)
