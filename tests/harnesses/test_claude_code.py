"""Claude Code, the real program at its pinned version, through both of luftpause's doors.

Its own loop goes through the dataplane's `/v1/messages` (translated to the simulated engines'
Chat Completions, or passed to engines serving the Messages API); with the runtime as its MCP
server it spawns sub-agents and awaits them. The simulated model follows a script of replies, so
each session makes the same tool calls every time; each session runs in a home of its own.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from luftpause.testkit.harnesses import ClaudeCode, HarnessStack
from luftpause.testkit.status import fetch_status
from tests.harnesses.runtime import results

pytestmark = pytest.mark.asyncio(loop_scope="module")

NOTE = "The Loire is 1,012 km long."


def files_session(work: Path) -> dict[str, Any]:
    """Write a note with the Write tool, read it back with Read, then say what it read."""
    note = str(work / "notes.txt")
    return {
        "offers": ["Write", "Read"],
        "replies": [
            {
                "calls": [
                    {"name": "Write", "arguments": {"file_path": note, "content": NOTE + "\n"}}
                ]
            },
            {"calls": [{"name": "Read", "arguments": {"file_path": note}}]},
            {"text": ["The note says: ", {"$results": True}]},
        ],
    }


async def run_files_session(stack: HarnessStack, url: str, tmp_path: Path) -> dict[str, Any]:
    work = tmp_path / "work"
    work.mkdir()
    await stack.script(files_session(work))
    await stack.reset()
    claude = ClaudeCode(base_url=url, home=tmp_path / "home", api_key=stack.token)
    ran = await claude.run(
        "Write a note about the Loire, then read it back.",
        cwd=work,
        allowed_tools=["Write", "Read"],
        timeout=90,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert (work / "notes.txt").read_text() == NOTE + "\n"
    output: dict[str, Any] = ran.json()
    return output


async def test_claude_codes_own_loop_is_one_run_whose_turns_stay_on_one_replica(
    stack: HarnessStack, tmp_path: Path
) -> None:
    before = (await fetch_status(stack.scheduler_status))["runs_total"]
    async with asyncio.timeout(120):
        output = await run_files_session(stack, stack.dataplane, tmp_path)
    assert output["is_error"] is False
    assert NOTE in output["result"]  # the Read tool's result reached the model's last turn
    per_engine = [len(seen) for seen in await stack.requests()]
    # Three turns (write, read, answer), all on the replica the first went to.
    assert sorted(per_engine) == [0, 3]
    seen = next(s for s in await stack.requests() if s)
    assert {r["path"] for r in seen} == {"/v1/chat/completions"}
    after = await fetch_status(stack.scheduler_status)
    assert after["runs_total"] == before + 1 and after["turns_in_flight"] == 0


async def test_claude_code_through_engines_serving_the_messages_api_keeps_its_headers(
    stack: HarnessStack, tmp_path: Path
) -> None:
    async with asyncio.timeout(120):
        output = await run_files_session(stack, stack.native, tmp_path)
    assert NOTE in output["result"]
    seen = next(s for s in await stack.requests() if s)
    assert len(seen) == 3 and {r["path"] for r in seen} == {"/v1/messages"}
    for request in seen:
        headers = {k.lower(): v for k, v in request["headers"].items()}
        assert headers["anthropic-version"] == "2023-06-01"
        assert "claude-code-20250219" in headers["anthropic-beta"]
        # Claude Code's key (the stack's token) is luftpause's, never the engine's.
        assert "x-api-key" not in headers and "authorization" not in headers


async def test_claude_code_spawns_three_sub_agents_and_awaits_them_in_one_call(
    stack: HarnessStack, tmp_path: Path
) -> None:
    rivers = ("Loire", "Rhine", "Danube")
    spawn = [
        {
            "name": "mcp__luftpause__spawn",
            "arguments": {"task": f"How long is the {r}?", "tools": ["lookup"]},
        }
        for r in rivers
    ]
    wait = {"handles": {"$collect": "handle"}, "timeout": 50}
    await stack.script(
        {
            "offers": ["mcp__luftpause__spawn", "mcp__luftpause__await"],
            "replies": [
                {"calls": spawn},
                {"calls": [{"name": "mcp__luftpause__await", "arguments": wait}]},
                {"text": ["The answers: ", {"$collect": "result"}]},
            ],
        }
    )
    claude = ClaudeCode(base_url=stack.dataplane, home=tmp_path / "home", api_key=stack.token)
    # The bearer comes from the environment through the MCP config's header option.
    config = claude.mcp_config(
        "luftpause", stack.mcp, {"Authorization": "Bearer ${LUFTPAUSE_TOKEN}"}
    )
    known = {run["handle"] for run in await stack.runs()}
    async with asyncio.timeout(120):
        ran = await claude.run(
            "Look up the lengths of three rivers with sub-agents.",
            cwd=tmp_path,
            mcp_config=config,
            allowed_tools=["mcp__luftpause__spawn", "mcp__luftpause__await"],
            # Claude Code defers MCP tools behind a search tool; the script calls them at once.
            extra_env={"LUFTPAUSE_TOKEN": stack.token, "ENABLE_TOOL_SEARCH": "false"},
            timeout=90,
        )
        assert ran.returncode == 0, ran.stderr[-2000:]
        spawned = [run for run in await stack.runs() if run["handle"] not in known]
        answers = await results(stack, [run["handle"] for run in spawned])
    assert sorted(run["task"] for run in spawned) == sorted(f"How long is the {r}?" for r in rivers)
    assert all(run["state"] == "finished" and run["own"]["toolCalls"] >= 1 for run in spawned)
    # The one await's result carried all three answers into Claude Code's next request, which
    # the script's last reply quotes.
    output = ran.json()
    assert output["result"].startswith("The answers: ")
    quoted = output["result"].removeprefix("The answers: ").split("; ")
    assert sorted(quoted) == sorted(answers) and all(answers)
