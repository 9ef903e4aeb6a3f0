"""Which runtime the status page shows: `--runtime-url` (or its variable) written into the page,
escaped; driven without sockets. The page itself runs in Chromium in test_status_page.
"""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from luftpause.common.config import Endpoint
from luftpause.scheduler.host import SchedulerHost
from luftpause.scheduler.http import build_app
from luftpause.scheduler.main import parse_args


async def page(runtime_url: str) -> str:
    host = SchedulerHost([Endpoint(id="a", url="http://a:1", models=frozenset({"m"}))])
    app = build_app(host, runtime_url=runtime_url)
    request = make_mocked_request("GET", "/", app=app)
    match = await app.router.resolve(request)
    response = await match.handler(request)
    assert isinstance(response, web.Response) and response.text is not None
    return response.text


async def test_the_page_carries_the_runtime_url_it_was_given() -> None:
    html = await page("http://127.0.0.1:7000")
    assert '<meta name="luftpause-runtime" content="http://127.0.0.1:7000">' in html


async def test_without_a_runtime_the_page_carries_none() -> None:
    assert '<meta name="luftpause-runtime" content="">' in await page("")


async def test_the_runtime_url_cannot_break_out_of_its_attribute() -> None:
    html = await page('http://x/"><script>alert(1)</script>')
    assert "<script>alert(1)" not in html
    assert 'content="http://x/&quot;&gt;&lt;script&gt;' in html


def test_the_runtime_url_comes_from_the_flag_or_the_environment() -> None:
    assert parse_args([], {}).runtime_url == ""
    flag = parse_args(["--runtime-url", "http://rt:7000/"], {})
    assert flag.runtime_url == "http://rt:7000"
    env = {"LUFTPAUSE_RUNTIME_URL": "https://rt.example"}
    assert parse_args([], env).runtime_url == "https://rt.example"


def test_a_runtime_url_that_is_not_http_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args([], {"LUFTPAUSE_RUNTIME_URL": "rt:7000"})
    assert exit_.value.code == 2
