"""The checked-in gRPC code (proto/luftpause/rpc/, beside its .proto) is what `make proto`
generates from it today."""

from __future__ import annotations

from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO = "luftpause/rpc/scheduler.proto"
OUT = ROOT / "proto" / "luftpause" / "rpc"


def test_generated_grpc_code_is_fresh(tmp_path: Path) -> None:
    code = protoc.main(
        [
            "protoc",
            f"-I{ROOT / 'proto'}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(ROOT / "proto" / PROTO),
        ]
    )
    assert code == 0
    fresh = tmp_path / "luftpause" / "rpc"
    names = sorted(p.name for p in fresh.iterdir())
    assert names == ["scheduler_pb2.py", "scheduler_pb2.pyi", "scheduler_pb2_grpc.py"]
    for name in names:
        assert (OUT / name).read_text() == (fresh / name).read_text(), (
            f"{name} is stale: run `make proto` and commit the result"
        )
