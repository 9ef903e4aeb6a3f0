"""The endpoint file: `load_from` entries, hosted endpoints' keys and paths (pure, no files)."""

from __future__ import annotations

from typing import Any

import pytest

from luftpause.common.config import Config, ConfigError, Priorities, load_config, parse_config


def engine(eid: str, **extra: Any) -> dict[str, Any]:
    return {"id": eid, "url": f"http://{eid}:8000", "models": ["m"], **extra}


def config(*endpoints: dict[str, Any]) -> Config:
    return parse_config({"endpoints": list(endpoints)})


def test_load_from_accepts_ids_of_other_endpoints_in_the_file() -> None:
    cfg = config(engine("gpu-0"), engine("gpu-1"), engine("router", load_from=["gpu-0", "gpu-1"]))
    router = cfg.endpoint("router")
    assert router is not None and router.load_from == ("gpu-0", "gpu-1")


def test_load_from_accepts_base_urls_of_engines_that_are_not_replicas() -> None:
    urls = ["http://10.0.0.5:30001", "https://gpu-1.internal:30001/", "http://[::1]:9000/prefix"]
    cfg = config(engine("router", load_from=urls))
    router = cfg.endpoint("router")
    assert router is not None and router.load_from == tuple(urls)


def test_load_from_mixes_ids_and_urls() -> None:
    cfg = config(engine("gpu-0"), engine("router", load_from=["gpu-0", "http://gpu-9:30001"]))
    router = cfg.endpoint("router")
    assert router is not None and router.load_from == ("gpu-0", "http://gpu-9:30001")


def test_load_from_as_a_single_string_is_one_entry() -> None:
    router = config(engine("router", load_from="http://gpu-0:1")).endpoint("router")
    assert router is not None and router.load_from == ("http://gpu-0:1",)


@pytest.mark.parametrize(
    "entry",
    ["gpu-7", "gpu-0:30001", "ftp://gpu-0:21", "http://", "http://gpu-0:notaport", "/metrics"],
)
def test_load_from_entry_that_is_neither_a_known_id_nor_a_url_is_rejected(entry: str) -> None:
    with pytest.raises(ConfigError) as err:
        config(engine("gpu-0"), engine("router", load_from=[entry]))
    message = str(err.value)
    assert "endpoint router: load_from" in message and repr(entry) in message
    assert "neither an endpoint id in this file nor an http(s)://host[:port] URL" in message


def test_load_from_url_with_a_query_is_rejected() -> None:
    with pytest.raises(ConfigError, match="neither an endpoint id"):
        config(engine("router", load_from=["http://gpu-0:1/?x=1"]))


def test_load_from_naming_the_router_itself_is_rejected() -> None:
    with pytest.raises(ConfigError, match="endpoint router: load_from names the endpoint itself"):
        config(engine("router", load_from=["router"]))


def test_load_from_listing_an_entry_twice_is_rejected() -> None:
    with pytest.raises(ConfigError, match="lists 'gpu-0' twice"):
        config(engine("gpu-0"), engine("router", load_from=["gpu-0", "gpu-0"]))


def test_load_from_naming_an_endpoint_without_a_metrics_path_is_rejected() -> None:
    with pytest.raises(ConfigError, match="names endpoint 'hosted', which has no metrics path"):
        config(engine("hosted", metrics=""), engine("router", load_from=["hosted"]))


def test_load_from_that_is_not_a_list_of_strings_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"endpoints\[0\].load_from must be a list of strings"):
        config(engine("router", load_from=[1, 2]))


def test_hosted_endpoint_has_https_url_key_variable_and_its_own_health_path() -> None:
    cfg = config(
        {
            "id": "hosted",
            "url": "https://api.example.com",
            "models": ["gpt"],
            "health": "/v1/models",
            "metrics": "",
            "api_key_env": "HOSTED_KEY",
        }
    )
    hosted = cfg.endpoint("hosted")
    assert hosted is not None
    assert (hosted.base_url, hosted.health, hosted.metrics) == (
        "https://api.example.com",
        "/v1/models",
        "",
    )
    assert hosted.api_key({"HOSTED_KEY": "sk-1"}) == "sk-1"
    assert hosted.api_key({}) == ""


def test_router_file_in_toml_loads_the_same_as_yaml(tmp_path: Any) -> None:
    toml = tmp_path / "endpoints.toml"
    toml.write_text(
        '[[endpoints]]\nid = "router"\nurl = "http://r:1"\nmodels = ["m"]\n'
        'load_from = ["http://gpu-0:2", "http://gpu-1:2"]\n'
    )
    yaml = tmp_path / "endpoints.yaml"
    yaml.write_text(
        "endpoints:\n  - id: router\n    url: http://r:1\n    models: [m]\n"
        "    load_from: [http://gpu-0:2, http://gpu-1:2]\n"
    )
    assert load_config(toml) == load_config(yaml)


def test_priority_gives_the_number_each_class_carries_to_the_engine() -> None:
    [e] = config(engine("a", priority={"interactive": 0, "batch": 10})).endpoints
    assert e.priority == Priorities(interactive=0, batch=10)
    assert e.priority is not None and not e.priority.preemptive
    [plain] = config(engine("b")).endpoints
    assert plain.priority is None
    [pre] = config(
        engine("c", priority={"interactive": 0, "batch": 100, "preemptive": True})
    ).endpoints
    assert pre.priority == Priorities(interactive=0, batch=100, preemptive=True)


@pytest.mark.parametrize(
    "value",
    [
        {"interactive": 0},
        {"interactive": 0, "batch": 1, "other": 2},
        {"interactive": "high", "batch": 0},
        {"interactive": True, "batch": 0},
        {"interactive": 0, "batch": 100, "preemptive": "yes"},
        {"batch": 100, "preemptive": True},
        [0, 1],
    ],
)
def test_priority_needs_two_integers_one_per_class(value: Any) -> None:
    with pytest.raises(ConfigError, match="priority"):
        config(engine("a", priority=value))


def test_kv_tokens_and_max_running_describe_a_batching_engine() -> None:
    [e] = config(engine("a", kv_tokens=96000, max_running=48)).endpoints
    assert (e.kv_tokens, e.max_running) == (96000, 48)
    [plain] = config(engine("b")).endpoints
    assert (plain.kv_tokens, plain.max_running) == (0, 0)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"kv_tokens": -1}, "kv_tokens"),
        ({"kv_tokens": "96k"}, "kv_tokens"),
        ({"kv_tokens": 1000, "kind": "single-pass"}, "kv_tokens is for generative"),
        ({"max_running": -2}, "max_running"),
        ({"max_running": 1.5}, "max_running"),
    ],
)
def test_kv_tokens_and_max_running_must_be_counts(extra: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        config(engine("a", **extra))


def test_generative_models_are_sorted_once_each_without_single_pass_ones() -> None:
    config = parse_config(
        {
            "endpoints": [
                {"id": "a", "url": "http://a:1", "models": ["zeta", "alpha"]},
                {"id": "b", "url": "http://b:1", "models": ["alpha"]},
                {"id": "c", "url": "http://c:1", "models": ["clf"], "kind": "single-pass"},
            ]
        }
    )
    assert config.generative_models() == ("alpha", "zeta")


def test_limits_are_parsed_with_their_defaults() -> None:
    config = parse_config(
        {
            "endpoints": [
                {"id": "a", "url": "http://a:1", "models": ["m"], "limits": {}},
                {
                    "id": "b",
                    "url": "http://b:1",
                    "models": ["m"],
                    "limits": {
                        "tpm": 1000,
                        "itpm": 10,
                        "share": "org",
                        "charges": "max_tokens",
                        "headers": {"X-RateLimit-Remaining-Tokens": "X-Left"},
                    },
                },
                {"id": "c", "url": "http://c:1", "models": ["m"]},
            ]
        }
    )
    a, b, c = config.endpoints
    assert a.limits is not None and a.limits.per_minute() == {} and c.limits is None
    assert b.limits is not None and b.limits.per_minute() == {"tokens": 1000, "input_tokens": 10}
    assert (b.limits.share, b.limits.charges) == ("org", "max_tokens")
    assert b.limits.headers == {"x-ratelimit-remaining-tokens": "x-left"}


@pytest.mark.parametrize(
    ("limits", "says"),
    [
        ([1000], "must be a mapping"),
        ({"tpm": -1}, "limits.tpm must be a whole number >= 0"),
        ({"tpm": "lots"}, "limits.tpm must be a whole number >= 0"),
        ({"rpn": 5}, "unknown keys ['rpn']"),
        ({"charges": "sometimes"}, "charges must be one of usage, max_tokens"),
        ({"headers": ["x"]}, "headers must map header names"),
        ({"share": 5}, "share must be a string"),
    ],
)
def test_bad_limits_are_refused_with_what_is_wrong(limits: object, says: str) -> None:
    raw = {"endpoints": [{"id": "a", "url": "http://a:1", "models": ["m"], "limits": limits}]}
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    assert says in str(err.value)


def test_stated_limits_may_count_over_another_window() -> None:
    raw = {"endpoints": [{"id": "a", "url": "http://a:1", "models": ["m"], "limits": {"tpm": 9}}]}
    (default,) = parse_config(raw).endpoints
    raw["endpoints"][0]["limits"] = {"tpm": 9, "window_s": 10}
    (short,) = parse_config(raw).endpoints
    assert default.limits is not None and default.limits.window_s == 60.0
    assert short.limits is not None and short.limits.window_s == 10.0
    raw["endpoints"][0]["limits"] = {"window_s": 0}
    with pytest.raises(ConfigError, match="window_s must be seconds"):
        parse_config(raw)


def test_an_endpoint_serves_chat_only_unless_its_apis_say_more() -> None:
    plain, native = config(engine("a"), engine("b", apis=["messages", "responses"])).endpoints
    assert plain.apis == frozenset({"chat"}) and plain.key_header == "authorization"
    assert native.apis == frozenset({"messages", "responses"})


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"apis": []}, "apis must list some of chat, messages, responses"),
        ({"apis": ["chat", "gemini"]}, "apis must list some of"),
        ({"apis": [1]}, "apis must be a list of strings"),
        ({"key_header": "api-key"}, "key_header must be authorization or x-api-key"),
    ],
)
def test_apis_and_key_header_are_checked(extra: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        config(engine("a", **extra))


def test_an_anthropic_endpoint_takes_its_key_in_x_api_key() -> None:
    [endpoint] = config(engine("a", apis=["messages"], key_header="X-Api-Key")).endpoints
    assert endpoint.key_header == "x-api-key"
