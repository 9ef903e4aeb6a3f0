"""Command-line options and the engine keys read from the endpoint file."""

from __future__ import annotations

from luftpause.common.config import parse_config
from luftpause.dataplane.context import DEFAULT_MAX_BODY_BYTES
from luftpause.dataplane.main import engine_keys, parse_args


def test_defaults_come_from_the_environment() -> None:
    args = parse_args([], {"LUFTPAUSE_DATAPLANE_PORT": "9090", "LUFTPAUSE_SCHEDULER": "sched:5000"})
    assert (args.host, args.port, args.scheduler) == ("127.0.0.1", 9090, "sched:5000")
    assert args.max_body_bytes == DEFAULT_MAX_BODY_BYTES == 16 * 1024 * 1024
    assert args.config is None and args.dataplane_id


def test_options_override_the_environment() -> None:
    args = parse_args(
        ["--port", "1", "--scheduler", "h:2", "--id", "dp-1", "--max-body-bytes", "10"],
        {"LUFTPAUSE_DATAPLANE_PORT": "9090"},
    )
    assert (args.port, args.scheduler, args.dataplane_id, args.max_body_bytes) == (
        1,
        "h:2",
        "dp-1",
        10,
    )


def test_engine_keys_map_replica_ids_to_keys_that_are_set() -> None:
    config = parse_config(
        {
            "endpoints": [
                {"id": "a", "url": "http://a:1", "models": ["m"], "api_key_env": "A_KEY"},
                {"id": "b", "url": "http://b:1", "models": ["m"], "api_key_env": "B_KEY"},
                {"id": "c", "url": "http://c:1", "models": ["m"]},
            ]
        }
    )
    assert engine_keys(config, {"A_KEY": "secret-a"}) == {"a": "secret-a"}
