"""Measure the images and the container test; write bench/results/images.json.

    .venv/bin/python -m tests.deploy.measure_images [--out FILE] [--skip-test]

Uses (or starts) the Docker engine like the tests and builds `luftpause-base:local` afresh, so
no layer of an earlier build matches; then every image of `make images` on it three times, one
after the other as `make images` builds them: cold (nothing cached: the first image builds the
shared layers and downloads the dependencies, the later ones reuse them), warm (nothing
changed: every layer from the cache), and after a code change (a new wheel: the dependency
layer is reused, the wheel is installed again). Then each image's size, and the container test
(tests/deploy/test_compose.py) with its own numbers. Takes some minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.deploy import containers as c

OUT = c.ROOT / "bench" / "results" / "images.json"


def rebuild_wheel_with_a_new_timestamp() -> None:
    """A wheel with other bytes, as a code change would give, without changing the code (the
    wheel is reproducible: only its file dates, from SOURCE_DATE_EPOCH, differ).
    """
    epoch = {"SOURCE_DATE_EPOCH": str(int(time.time()))}
    c.run(["make", "--no-print-directory", "-B", "wheel"], timeout=300, env=epoch)


def measure(daemon: c.Daemon, run_test: bool) -> dict[str, Any]:
    docker = daemon.docker
    c.run([docker, "image", "rm", "--force", c.LOCAL_BASE], timeout=120, check=False)
    base_seconds = c.build_base(docker)
    build = {"base_image": c.LOCAL_BASE, "ca_certs": str(c.HOST_CA_DIR)}

    def images() -> dict[str, float]:
        return c.build_images(docker, c.ALL_IMAGES, base_image=c.LOCAL_BASE, ca_certs=c.HOST_CA_DIR)

    cold = images()
    warm = images()
    rebuild_wheel_with_a_new_timestamp()
    changed = images()
    sizes = {n: c.image_size(docker, f"luftpause/{n}:{c.VERSION}") for n in c.ALL_IMAGES}
    base_size = c.image_size(docker, c.LOCAL_BASE)
    result: dict[str, Any] = {
        "version": c.VERSION,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "docker": c.run(
            [docker, "version", "--format", "{{.Server.Version}}"], timeout=30
        ).stdout.strip(),
        "build": build,
        "base_image_bytes": base_size,
        "base_image_build_seconds": round(base_seconds, 1),
        "images": {
            name: {
                "bytes": sizes[name],
                "mb_above_base": round((sizes[name] - base_size) / 1e6, 1),
                "cold_seconds": cold[name],
                "warm_seconds": warm[name],
                "after_code_change_seconds": changed[name],
            }
            for name in c.ALL_IMAGES
        },
        "cold_total_seconds": round(sum(cold.values()), 1),
        "warm_total_seconds": round(sum(warm.values()), 1),
        "after_code_change_total_seconds": round(sum(changed.values()), 1),
    }
    if run_test:
        result["compose_test"] = compose_test()
    return result


def compose_test() -> dict[str, Any]:
    """Run tests/deploy/test_compose.py; its outcome, wall time and the numbers it reports."""
    with tempfile.TemporaryDirectory() as tmp:
        numbers = Path(tmp) / "report.json"
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "tests/deploy/test_compose.py"],
            cwd=c.ROOT,
            env={**os.environ, "LUFTPAUSE_DEPLOY_REPORT": str(numbers)},
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
        )  # fmt: skip
        seconds = round(time.monotonic() - started, 1)
        reported = json.loads(numbers.read_text()) if numbers.exists() else {}
    summary = (done.stdout.strip().splitlines() or [""])[-1]
    reported.pop("logs", None)
    return {"outcome": summary, "seconds": seconds, **reported}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.deploy.measure_images")
    parser.add_argument("--out", type=Path, default=OUT, help=f"JSON file (default {OUT})")
    parser.add_argument("--skip-test", action="store_true", help="images only")
    args = parser.parse_args(argv)
    daemon = c.Daemon().ensure()
    try:
        result = measure(daemon, run_test=not args.skip_test)
    finally:
        daemon.stop()
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
