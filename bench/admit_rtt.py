"""Admission round trip over gRPC on loopback: one at a time, and paced at a fixed rate.

Run: `.venv/bin/python -m bench.admit_rtt [--rate 1000] [--seconds 5] [--sequential 2000]
[--repeats 1]`.
Two arms: admissions on one `Report` stream (what the dataplane does) and one unary `Admit`
call per turn. Every admitted turn is reported finished on the session right after (not
timed), so the scheduler's state stays the size of a live pool. The client is Python grpc.aio
on the same machine: its own cost is inside every number; the scheduler's CPU per admission
(utime+stime from /proc, sequential phase) is reported beside it. With `--repeats` the arms'
order rotates from repeat to repeat (`common.rotated`) and each arm's samples are pooled over
its repeats; each arm records the machine's load per repeat (`common.LoadWatch`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import grpc
import uvloop

from bench.common import LoadWatch, percentiles, rotated, write_result
from bench.overhead import cpu_seconds
from luftpause.rpc import scheduler_pb2 as pb
from luftpause.rpc import scheduler_pb2_grpc as pb_grpc
from luftpause.testkit.stack import LocalStack

ARMS = ("session", "unary")


class Admitter:
    """Admits turns over a unary `Admit` call each, or over one `Report` stream (the
    dataplane's way); either way each admitted turn is reported finished on the session."""

    def __init__(self, stub: pb_grpc.SchedulerStub, *, unary: bool) -> None:
        self.stub = stub
        self.unary = unary
        self.n = 0
        self.session = stub.Report()
        self.waiting: dict[str, asyncio.Future[pb.AdmitReply]] = {}
        # One writer: a gRPC stream takes one write at a time; it sends what queued as one message.
        self.items: asyncio.Queue[pb.DataplaneItem | None] = asyncio.Queue()
        self.writer = asyncio.create_task(self._write())
        self.reader = asyncio.create_task(self._read())

    async def _write(self) -> None:
        while (item := await self.items.get()) is not None:
            batch = pb.DataplaneBatch(items=[item])
            while not self.items.empty() and (item := self.items.get_nowait()) is not None:
                batch.items.append(item)
            await self.session.write(batch)
            if item is None:
                break
        await self.session.done_writing()

    async def _read(self) -> None:
        async for batch in self.session:
            for placement in batch.placements:
                self.waiting.pop(placement.turn_id).set_result(placement.placed)

    async def close(self) -> None:
        self.items.put_nowait(None)
        await self.writer
        await self.reader

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
        if self.unary:
            await self.stub.Admit(req)
        else:
            fut = asyncio.get_running_loop().create_future()
            self.waiting[turn] = fut
            self.items.put_nowait(pb.DataplaneItem(admit=req))
            await fut
        rtt = time.perf_counter() - t0
        finished = pb.TurnFinished(finish_reason="stop")
        event = pb.TurnEvent(turn_id=turn, run_id=f"r{run}", finished=finished)
        self.items.put_nowait(pb.DataplaneItem(event=event))
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
        scheduler = local.procs["scheduler"].pid
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
        for r in range(args.repeats):
            for arm in rotated(ARMS, r):
                with LoadWatch() as load:
                    ran = await one_arm(stub, arm, args, scheduler)
                runs[arm].append({**ran, "load": load.summary()})
        out: dict[str, object] = {arm: pooled(rs, args) for arm, rs in runs.items()}
        out["resync_ms"] = await resync(stub, args.resync_runs, 5)
        return out


async def one_arm(
    stub: pb_grpc.SchedulerStub, arm: str, args: argparse.Namespace, scheduler: int
) -> dict[str, Any]:
    """One repeat of `arm`: the sequential phase (with the scheduler's CPU), then the paced."""
    adm = Admitter(stub, unary=arm == "unary")
    await sequential(adm, 200)  # warm-up
    c0 = cpu_seconds([scheduler])
    seq = await sequential(adm, args.sequential)
    cpu = cpu_seconds([scheduler]) - c0
    rtts, achieved = await paced(adm, args.rate, args.seconds)
    await adm.close()
    return {"sequential": seq, "cpu": cpu, "paced": rtts, "achieved": achieved}


def pooled(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """One arm over its repeats: samples pooled, the achieved rate the median repeat's."""
    cpu = sum(r["cpu"] for r in runs)
    return {
        "sequential_ms": percentiles([x for r in runs for x in r["sequential"]]),
        "scheduler_cpu_ms_per_admit_sequential": round(
            1000 * cpu / (args.sequential * len(runs)), 3
        ),
        "paced": {
            "target_rate": args.rate,
            "achieved_rate": round(statistics.median(r["achieved"] for r in runs), 1),
            "rtt_ms": percentiles([x for r in runs for x in r["paced"]]),
        },
        "load": [r["load"] for r in runs],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--sequential", type=int, default=2000)
    p.add_argument("--resync-runs", type=int, default=10000)
    p.add_argument("--repeats", type=int, default=1, help="of both arms, their order rotated")
    args = p.parse_args()
    result = uvloop.run(run(args))
    path = write_result("admit_rtt", {"benchmark": "admit_rtt", **result})
    print(path.read_text())


if __name__ == "__main__":
    main()
