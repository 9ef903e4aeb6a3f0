"""Admit round trip over gRPC on loopback: one at a time, and paced at a fixed rate.

Run: `.venv/bin/python -m bench.admit_rtt [--rate 1000] [--seconds 5] [--sequential 2000]`.
Every admitted turn is reported finished on the Report stream right after (not timed), so the
scheduler's state stays the size of a live pool. The client is Python grpc.aio on the same
machine: its own cost is inside every number.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

import grpc
import uvloop

from bench.common import percentiles, write_result
from luftpause.rpc import scheduler_pb2 as pb
from luftpause.rpc import scheduler_pb2_grpc as pb_grpc
from luftpause.testkit.stack import LocalStack


class Admitter:
    def __init__(self, stub: pb_grpc.SchedulerStub, report: grpc.aio.StreamUnaryCall) -> None:
        self.stub = stub
        self.report = report
        self.n = 0
        # One writer: a gRPC stream takes one write at a time.
        self.events: asyncio.Queue[pb.TurnEvent | None] = asyncio.Queue()
        self.writer = asyncio.create_task(self._write())

    async def _write(self) -> None:
        while (event := await self.events.get()) is not None:
            await self.report.write(event)
        await self.report.done_writing()

    async def one(self, run: int) -> float:
        self.n += 1
        turn = f"t{self.n}"
        req = pb.AdmitRequest(
            turn_id=turn,
            run_id=f"r{run}",
            model="luftpause-sim",
            service_class=pb.SERVICE_CLASS_INTERACTIVE,
            caller=f"c{run % 8}",
            dataplane_id="bench",
        )
        t0 = time.perf_counter()
        await self.stub.Admit(req)
        rtt = time.perf_counter() - t0
        self.events.put_nowait(
            pb.TurnEvent(
                turn_id=turn, run_id=f"r{run}", finished=pb.TurnFinished(finish_reason="stop")
            )
        )
        return rtt


async def sequential(adm: Admitter, count: int) -> list[float]:
    return [await adm.one(i % 1000) for i in range(count)]


async def paced(adm: Admitter, rate: float, seconds: float) -> tuple[list[float], float]:
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[float]] = []
    start = loop.time()
    total = int(rate * seconds)
    for i in range(total):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(adm.one(i % 1000)))
    rtts = await asyncio.gather(*tasks)
    return list(rtts), total / (loop.time() - start)


def resync_request(runs: int) -> pb.ResyncRequest:
    """A dataplane with `runs` runs, a fifth of them with a turn in flight."""
    req = pb.ResyncRequest(dataplane_id="bench-resync")
    for i in range(runs):
        req.runs.add(
            run_id=f"rs{i}",
            replica_id=f"engine-{i % 2}",
            phase=pb.RUN_PHASE_TOOL_PAUSED if i % 2 else pb.RUN_PHASE_IDLE,
            service_class=pb.SERVICE_CLASS_BATCH,
            caller=f"c{i % 16}",
            idle_seconds=1,
        )
        if i % 5 == 0:
            req.turns.add(
                turn_id=f"rt{i}",
                run_id=f"rs{i}",
                replica_id=f"engine-{i % 2}",
                model="luftpause-sim",
                service_class=pb.SERVICE_CLASS_BATCH,
                caller=f"c{i % 16}",
            )
    return req


async def resync(stub: pb_grpc.SchedulerStub, runs: int, repeats: int) -> dict[str, float]:
    req = resync_request(runs)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await stub.Resync(req)
        samples.append(time.perf_counter() - t0)
    empty = pb.ResyncRequest(dataplane_id="bench-resync")
    await stub.Resync(empty)  # leave nothing behind for the admit runs
    return {"runs": runs, "turns": len(req.turns), "bytes": req.ByteSize(), **percentiles(samples)}


async def run(args: argparse.Namespace) -> dict[str, object]:
    async with AsyncExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="bench-admit-"))
        local = await LocalStack(workdir, with_dataplane=False).start(stack)
        await local.wait_healthy()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{local.grpc_port}")
        stack.push_async_callback(channel.close)
        stub = pb_grpc.SchedulerStub(channel)
        report = stub.Report()
        adm = Admitter(stub, report)
        await sequential(adm, 200)  # warm-up
        seq = await sequential(adm, args.sequential)
        rtts, achieved = await paced(adm, args.rate, args.seconds)
        resync_ms = await resync(stub, args.resync_runs, 5)
        adm.events.put_nowait(None)
        await adm.writer
        return {
            "sequential_ms": percentiles(seq),
            "resync_ms": resync_ms,
            "paced": {
                "target_rate": args.rate,
                "achieved_rate": round(achieved, 1),
                "rtt_ms": percentiles(rtts),
            },
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--sequential", type=int, default=2000)
    p.add_argument("--resync-runs", type=int, default=10000)
    args = p.parse_args()
    result = uvloop.run(run(args))
    path = write_result("admit_rtt", {"benchmark": "admit_rtt", **result})
    print(path.read_text())


if __name__ == "__main__":
    main()
