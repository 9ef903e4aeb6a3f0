"""The fake-engine command line maps every flag onto the simulator's parameters."""

from __future__ import annotations

import pytest

from luftpause.testkit.engine.main import build_parser, params_from, parse_args
from luftpause.testkit.engine.params import EngineParams, SimParams


def test_defaults_on_the_command_line_are_the_simulators_defaults() -> None:
    params = params_from(build_parser().parse_args([]))
    assert params == SimParams()
    assert params.engine == EngineParams()


def test_every_model_flag_reaches_the_parameters() -> None:
    args = build_parser().parse_args(
        [
            "--id=e1",
            "--model=m1",
            "--kind=single-pass",
            "--kv-tokens=4096",
            "--block-size=32",
            "--max-running=8",
            "--max-prefill-tokens=2048",
            "--prefill-ms-per-token=1.5",
            "--decode-base-ms=20",
            "--decode-ms-per-seq=3",
            "--time-scale=50",
            "--tool-rounds=2",
            "--reply-tokens=16",
            "--default-max-tokens=128",
            "--labels=a,b",
            "--rpm=10",
            "--tpm=1000",
            "--rate-window-s=30",
            "--require-key=k",
        ]
    )
    p = params_from(args)
    assert (p.replica_id, p.model, p.kind, p.time_scale) == ("e1", "m1", "single-pass", 50.0)
    assert (p.tool_rounds, p.reply_tokens, p.default_max_tokens) == (2, 16, 128)
    assert (p.labels, p.rpm, p.tpm, p.rate_window_s, p.require_key) == (
        ("a", "b"),
        10,
        1000,
        30.0,
        "k",
    )
    assert p.engine == EngineParams(
        kv_tokens=4096,
        block_size=32,
        max_running=8,
        max_prefill_tokens=2048,
        prefill_ms_per_token=1.5,
        decode_base_ms=20.0,
        decode_ms_per_seq=3.0,
    )


def test_an_impossible_parameter_is_refused() -> None:
    with pytest.raises(ValueError, match="time_scale"):
        params_from(build_parser().parse_args(["--time-scale=0"]))


def test_the_admission_mode_and_stream_interval_reach_the_parameters() -> None:
    p = params_from(build_parser().parse_args(["--admission=sglang", "--stream-interval=4"]))
    assert p.engine.admission == "sglang" and p.stream_interval == 4
    assert params_from(build_parser().parse_args([])).engine.admission == "reserve"


def test_the_flags_where_engines_differ_reach_the_parameters() -> None:
    argv = [
        "--admission=ondemand",
        "--reply-reserve=0.25",
        "--reserve-cap=256",
        "--prefix-cache=message",
        "--block-size=1",
        "--eviction=fifo",
        "--chunked-prefill=separate",
        "--chunk-tokens=4096",
        "--metrics=sglang",
        "--no-server-info",
    ]
    p = params_from(build_parser().parse_args(argv))
    e = p.engine
    assert (e.admission, e.reply_reserve, e.reserve_cap) == ("ondemand", 0.25, 256)
    assert (e.prefix_cache, e.block_size, e.eviction) == ("message", 1, "fifo")
    assert (e.chunked_prefill, e.chunk_tokens) == ("separate", 4096)
    assert (p.metrics, p.server_info) == ("sglang", False)
    default = params_from(build_parser().parse_args([]))
    assert (default.metrics, default.server_info, default.engine.prefix_cache) == (
        "both",
        True,
        "block",
    )
    with pytest.raises(ValueError, match="reply_reserve"):
        params_from(build_parser().parse_args(["--reply-reserve=1.5"]))


@pytest.mark.parametrize(
    "argv", [["--admission=eager"], ["--stream-interval=0"], ["--stream-interval=x"]]
)
def test_a_bad_admission_mode_or_stream_interval_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert argv[0].split("=")[0] in capsys.readouterr().err


def test_the_rate_limit_flags_reach_the_parameters() -> None:
    args = build_parser().parse_args(
        [
            "--itpm=800",
            "--otpm=200",
            "--rate-limit-window-s=10",
            "--rate-limit-regime=continuous",
            "--rate-limit-charge=usage",
            "--rate-limit-headers=anthropic",
        ]
    )
    p = params_from(args)
    assert p.rate_limits == {"rpm": None, "tpm": None, "itpm": 800, "otpm": 200}
    assert (p.rate_window_s, p.rate_limit_regime) == (10.0, "continuous")
    assert (p.rate_limit_charge, p.rate_limit_headers) == ("usage", "anthropic")
    assert p.hosted


def test_the_rate_limit_defaults_are_todays_fixed_window_openai_behaviour() -> None:
    p = params_from(build_parser().parse_args([]))
    assert not p.hosted
    assert (p.rate_limit_regime, p.rate_limit_charge, p.rate_limit_headers) == (
        "fixed",
        "max_tokens",
        "openai",
    )


def test_the_rate_limit_flags_are_set_by_their_environment_variables() -> None:
    env = {
        "LUFTPAUSE_RPM": "3",
        "LUFTPAUSE_ITPM": "900",
        "LUFTPAUSE_RATE_WINDOW_S": "5",
        "LUFTPAUSE_RATE_LIMIT_REGIME": "continuous",
        "LUFTPAUSE_RATE_LIMIT_CHARGE": "usage",
        "LUFTPAUSE_RATE_LIMIT_HEADERS": "anthropic",
    }
    p = params_from(parse_args(["--rpm=4"], env))
    assert (p.rpm, p.itpm, p.rate_window_s) == (4, 900, 5.0)
    assert (p.rate_limit_regime, p.rate_limit_charge, p.rate_limit_headers) == (
        "continuous",
        "usage",
        "anthropic",
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--otpm=0"], "otpm"),
        (["--itpm=-3"], "itpm"),
        (["--rate-window-s=0"], "rate_window_s"),
    ],
)
def test_an_impossible_rate_limit_is_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        params_from(build_parser().parse_args(argv))


@pytest.mark.parametrize(
    "argv",
    [["--rate-limit-regime=leaky"], ["--rate-limit-charge=all"], ["--rate-limit-headers=groq"]],
)
def test_a_bad_rate_limit_choice_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert argv[0].split("=")[0] in capsys.readouterr().err


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rate_limit_regime", "leaky"),
        ("rate_limit_charge", "all"),
        ("rate_limit_headers", "groq"),
        ("tpm", 0),
    ],
)
def test_sim_params_name_a_bad_rate_limit_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SimParams(**{field: value})  # type: ignore[arg-type]
