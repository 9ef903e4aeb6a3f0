"""The simulator's HTTP face: OpenAI Chat Completions, vLLM /classify, metrics, debug.

Shell layer: parses requests, asks the pure modules what to answer, and waits on the `EngineDriver`
for tokens. The Messages and Responses APIs (`doors`) go through the same chat path, their replies
written back in their own API; a script of replies (`scripted`, set with `--script` or `POST
/debug/script`) says what the model answers where it has a reply. A client that goes away aborts
its request in the engine (the runner cancels the handler on disconnect; a failed write does the
same). An injected failure (`x-sim-fail`, see `parsing`) refuses at once or cuts the connection
part way through a reply; a cut request is aborted in the engine like a client's. `replies` writes
streams and cuts.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import ssl
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from luftpause.dataplane.apis import api_of, error_document
from luftpause.testkit.engine import doors, metrics, replies, slotfiles, wire
from luftpause.testkit.engine.driver import EngineDriver, SimClock
from luftpause.testkit.engine.params import SimParams
from luftpause.testkit.engine.parsing import (
    HttpError,
    decode_body,
    parse_chat,
    parse_classify,
    too_long,
)
from luftpause.testkit.engine.ratelimit import Cost, RateLimiter, parse_limits
from luftpause.testkit.engine.ratelimit_headers import retry_headers
from luftpause.testkit.engine.records import RequestTooLarge, Submission
from luftpause.testkit.engine.script import classify_probs, is_summary_request, plan_reply
from luftpause.testkit.engine.scripted import Script, ScriptError, parse_script
from luftpause.testkit.engine.tokens import (
    END,
    render_parts,
    reply_cut,
    tokenize,
    tokenize_continuation,
)


def _nodelay(request: web.Request) -> bool | None:
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


class Simulator:
    """State shared by the handlers of one simulated replica."""

    def __init__(self, params: SimParams, script: Script | None = None) -> None:
        self.params = params
        # The replies a harness's session gets (`scripted`); None: every reply is planned.
        self.script = script
        self.clock = SimClock(params.time_scale)
        self.driver = EngineDriver(params.engine, self.clock)
        self.limiter = RateLimiter(
            **params.rate_limits,
            regime=params.rate_limit_regime,
            window_s=params.rate_window_s,
            time_scale=params.time_scale,
            headers=params.rate_limit_headers,
        )
        self.debug_log: deque[dict[str, Any]] = deque(maxlen=params.debug_log_size)
        self.slot_files = slotfiles.SlotFiles()  # `--slot-saves`
        self.started = int(time.time())
        self.reset_counters()

    def reset_counters(self) -> None:
        self.requests_total = 0
        self.rejected_total = 0

    def note(self, request: web.Request, *, count: bool = True) -> dict[str, Any]:
        """Keep a request in the debug log; chat and classify requests are also counted."""
        self.requests_total += count
        entry: dict[str, Any] = {
            "time": time.time(),
            "method": request.method,
            "path": request.path,
            "headers": {k: ", ".join(request.headers.getall(k)) for k in request.headers},
            "model": None,
            "stream": False,
            "tcp_nodelay": _nodelay(request),
        }
        self.debug_log.append(entry)
        return entry

    def check_key(self, request: web.Request) -> None:
        key = self.params.require_key
        if key is not None and request.headers.get("Authorization") != f"Bearer {key}":
            raise HttpError(401, "Incorrect API key provided.", "invalid_api_key")

    def sim_s(self) -> float:
        return self.clock.sim_ms() / 1000.0

    def charge(self, cost: Cost) -> dict[str, str]:
        """Apply the hosted-API budgets (none: all pass); returns the rate-limit headers."""
        verdict = self.limiter.check(self.sim_s(), cost, wall_s=time.time())
        if not verdict.allowed:
            err = HttpError(429, verdict.message, "rate_limit_exceeded")
            err.headers = {**verdict.headers, **retry_headers(verdict.retry_after_s)}
            raise err
        return verdict.headers


SIM = web.AppKey("sim", Simulator)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await answer_chat(request, decode_body(await request.read()))


async def answer_chat(
    request: web.Request, body: dict[str, Any], native: doors.NativeReply | None = None
) -> web.StreamResponse:
    """Answer the chat request `body`; in another API's form when it came in by one."""
    sim = request.app[SIM]
    entry = sim.note(request)
    if sim.params.kind != "generative":
        raise HttpError(404, "This engine is single-pass; use /classify.")
    sim.check_key(request)
    chat = parse_chat(body, request.headers, sim.params)
    # llama.cpp's `id_slot` means nothing here (no slots); the log shows what was asked for.
    slot = chat.body.get("id_slot")
    entry.update(model=chat.model, stream=chat.stream, priority=chat.priority, id_slot=slot)
    entry["summary"] = is_summary_request(chat.body["messages"])  # a context wall's summary
    entry["max_tokens"] = chat.body.get("max_tokens")  # as sent (null: none), not as reserved
    if chat.fail is not None and chat.fail.status is not None:
        raise _injected(chat.fail.status)
    text, cuts = render_parts(chat.body["messages"], chat.body.get("tools"))
    prompt = tokenize(text)
    window = sim.params.context_window
    if window is not None and len(prompt) + chat.max_tokens > window:
        raise too_long(window, len(prompt), chat.max_tokens)
    reply = None
    if sim.script is not None:
        reply = sim.script.reply(chat.body, max_tokens=chat.max_tokens, new_id=_call_id)
    if reply is None:
        reply = plan_reply(
            chat.body,
            tool_rounds=chat.tool_rounds,
            reply_tokens=sim.params.reply_tokens,
            max_tokens=chat.max_tokens,
            call_id=_call_id(),
            tool_style=chat.tool_style,
        )
    usage_charged = sim.params.rate_limit_charge == "usage"
    output = len(reply.pieces) if usage_charged else chat.max_tokens
    headers = sim.charge(Cost(input_tokens=len(prompt), output_tokens=output))
    sub = Submission(
        rid=f"chatcmpl-{secrets.token_hex(12)}",
        prompt=tuple(prompt),
        reserve=chat.max_tokens,
        output_tokens=len(reply.pieces),
        history=tuple(tokenize_continuation(text, prompt, reply.body + END)),
        priority=chat.priority,
        prompt_cuts=cuts,
        history_cuts=(*cuts, reply_cut(text, reply.body)),
    )
    try:
        handle = sim.driver.submit(sub, stream=chat.stream)
    except RequestTooLarge as exc:
        raise HttpError(400, str(exc), "context_length_exceeded") from exc
    env = wire.Envelope(
        id=sub.rid, created=int(time.time()), model=chat.model, fingerprint=sim.params.replica_id
    )
    try:
        if chat.stream:
            interval = sim.params.stream_interval
            respond = None if native is None else native.response
            return await replies.stream(
                request, handle, env, reply, chat, headers, interval, respond
            )
        await handle.done
        use = wire.usage(prompt=len(prompt), completion=handle.generated, cached=handle.cached)
        out = wire.completion(env, reply, handle.generated, use, chat.top_logprobs)
        if native is not None:
            out = native.whole(out)
        if chat.fail is not None:
            return await replies.cut_body(request, json.dumps(out).encode(), headers)
        return web.json_response(out, headers=headers)
    finally:
        sim.limiter.bill(len(prompt) + handle.generated)  # what was served, cut short or not
        sim.driver.release(sub.rid)


def _call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def _injected(status: int) -> HttpError:
    """The refusal asked for by `x-sim-fail: <status>`."""
    kind = "rate_limit_exceeded" if status == 429 else "server_error"
    err = HttpError(status, f"Simulated failure: status {status}.", kind)
    err.headers = {"Retry-After": "1"}
    return err


async def classify(request: web.Request) -> web.StreamResponse:
    sim = request.app[SIM]
    entry = sim.note(request)
    if sim.params.kind != "single-pass":
        raise HttpError(404, "This engine is generative; /classify is not served.")
    sim.check_key(request)
    body = decode_body(await request.read())
    texts = parse_classify(body)
    model = str(body.get("model") or sim.params.model)
    entry.update(model=model)
    prompts = [tokenize(f"<|input|>\n{t}") for t in texts]
    n_tokens = sum(len(p) for p in prompts)
    headers = sim.charge(Cost(input_tokens=n_tokens))
    rid = f"classify-{secrets.token_hex(12)}"
    subs = [
        Submission(rid=f"{rid}-{i}", prompt=tuple(p), reserve=0, output_tokens=0)
        for i, p in enumerate(prompts)
    ]
    handles = []
    try:
        handles += [sim.driver.submit(s, stream=False) for s in subs]
        await asyncio.gather(*(h.done for h in handles))
    except RequestTooLarge as exc:
        raise HttpError(400, str(exc), "context_length_exceeded") from exc
    finally:
        sim.limiter.bill(sum(len(h.sub.prompt) for h in handles))
        for s in subs:
            sim.driver.release(s.rid)
    labels = sim.params.labels
    out = wire.classification(
        id=rid,
        created=int(time.time()),
        model=model,
        labels=labels,
        probs=[classify_probs(t, labels) for t in texts],
        prompt_tokens=n_tokens,
    )
    return web.json_response(out, headers=headers)


async def list_models(request: web.Request) -> web.StreamResponse:
    sim = request.app[SIM]
    sim.note(request, count=False)
    sim.check_key(request)
    params = sim.params
    models = wire.models(params.model, sim.started, params.replica_id, params.context_window)
    return web.json_response(models)


async def health(request: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "ok"})


async def server_info(request: web.Request) -> web.StreamResponse:
    """SGLang's /server_info: the pool size and limits a client may size its load by (404 on an
    engine that does not serve it, `--no-server-info`)."""
    sim = request.app[SIM]
    if not sim.params.server_info:
        raise HttpError(404, "Not Found")
    return web.json_response(wire.server_info(sim.params))


async def prometheus(request: web.Request) -> web.StreamResponse:
    sim = request.app[SIM]
    tally = sim.limiter.tally
    shell = metrics.ShellCounters(
        requests_total=sim.requests_total,
        rate_limited_total=tally.refused,
        served_total=tally.served,
        billed_tokens_total=tally.billed_tokens,
        refused_tokens_total=tally.refused_tokens,
        rejected_total=sim.rejected_total,
        steps_total=sim.driver.steps,
        busy_ms_total=sim.driver.busy_ms,
        lag_seconds=sim.driver.lag_s,
    )
    text = metrics.render(
        sim.driver.stats(),
        shell,
        model=sim.params.model,
        replica=sim.params.replica_id,
        names=sim.params.metrics,
    )
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def slot_action(request: web.Request) -> web.StreamResponse:
    """llama.cpp's slot save and restore (see `slotfiles`); the debug log shows each call."""
    sim = request.app[SIM]
    entry = sim.note(request, count=False)
    if not sim.params.slot_saves:
        raise HttpError(501, slotfiles.NOT_ENABLED, "not_supported_error")
    sim.check_key(request)
    try:
        slot = int(request.match_info["slot"])
    except ValueError:
        raise HttpError(400, "Invalid slot id") from None
    action, filename = (
        request.query.get("action", ""),
        decode_body(await request.read()).get("filename"),
    )
    entry.update(slot_action=action, id_slot=slot, filename=filename)
    return web.json_response(sim.slot_files.act(action, slot, filename))


async def debug_requests(request: web.Request) -> web.StreamResponse:
    return web.json_response({"requests": list(request.app[SIM].debug_log)})


async def debug_limits(request: web.Request) -> web.StreamResponse:
    """The hosted-API limits, each budget now, and what was served, refused and billed."""
    sim = request.app[SIM]
    described = sim.limiter.describe(sim.sim_s())
    return web.json_response({**described, "charge": sim.params.rate_limit_charge})


async def debug_set_limits(request: web.Request) -> web.StreamResponse:
    """New limits at once (`{"tpm": 500, "rpm": 3}`, null removes one): a provider's change."""
    sim = request.app[SIM]
    try:
        changes = parse_limits(json.loads(await request.read()))
    except ValueError as exc:  # bad JSON and bad values alike; not a counted rejection
        return web.json_response(wire.error(f"Invalid limits: {exc}"), status=400)
    sim.limiter.set_limits(sim.sim_s(), changes)
    return await debug_limits(request)


async def debug_script(request: web.Request) -> web.StreamResponse:
    """The script of replies now (`{"script": null}` when there is none)."""
    script = request.app[SIM].script
    if script is None:
        return web.json_response({"script": None})
    return web.json_response(
        {"script": {"offers": sorted(script.offers), "replies": len(script.steps)}}
    )


async def debug_set_script(request: web.Request) -> web.StreamResponse:
    """Set the script of replies (`scripted`'s document as JSON; `null` removes it)."""
    sim = request.app[SIM]
    try:
        raw = json.loads(await request.read())
        sim.script = None if raw is None else parse_script(raw)
    except (ValueError, ScriptError) as exc:
        return web.json_response(wire.error(f"Invalid script: {exc}"), status=400)
    return await debug_script(request)


async def debug_reset(request: web.Request) -> web.StreamResponse:
    sim = request.app[SIM]
    sim.driver.reset_counters()
    sim.driver.core.cache.drop_unreferenced()
    sim.limiter.reset()
    sim.debug_log.clear()
    sim.reset_counters()
    return web.json_response({"status": "ok"})


@web.middleware
async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except HttpError as exc:
        if exc.status != 429:  # 429s are counted by the limiter
            request.app[SIM].rejected_total += 1
        body = wire.error(str(exc), exc.kind, exc.code)
        if request.path.startswith("/v1/messages"):  # Anthropic's shape on its API's paths
            body = error_document(api_of(request.path), exc.status, str(exc))
        return web.json_response(body, status=exc.status, headers=exc.headers)
    except web.HTTPException as exc:  # unknown path or method: same error shape
        if exc.status < 400:
            raise
        return web.json_response(wire.error(exc.reason), status=exc.status)


def make_app(params: SimParams, script: Script | None = None) -> web.Application:
    """The aiohttp application of one simulated replica (the engine loop starts with it)."""
    app = web.Application(middlewares=[errors], client_max_size=64 * 1024 * 1024)
    sim = Simulator(params, script)
    app[SIM] = sim

    async def lifecycle(app: web.Application) -> Any:
        sim.driver.start()
        yield
        await sim.driver.stop()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/messages", doors.messages(answer_chat))
    app.router.add_post("/v1/messages/count_tokens", doors.count_tokens)
    app.router.add_post("/v1/responses", doors.responses(answer_chat))
    app.router.add_post("/classify", classify)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/metrics", prometheus)
    app.router.add_post("/slots/{slot}", slot_action)
    app.router.add_get("/debug/requests", debug_requests)
    app.router.add_get("/debug/limits", debug_limits)
    app.router.add_post("/debug/limits", debug_set_limits)
    app.router.add_post("/debug/reset", debug_reset)
    app.router.add_get("/debug/script", debug_script)
    app.router.add_post("/debug/script", debug_set_script)
    return app


@dataclass(frozen=True, slots=True, kw_only=True)
class RunningServer:
    runner: web.AppRunner
    host: str
    port: int
    tls: bool = False

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def sim(self) -> Simulator:
        return self.runner.app[SIM]

    async def close(self) -> None:
        await self.runner.cleanup()


def server_tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server-side TLS context from a PEM certificate chain and its private key."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context


async def serve(
    params: SimParams,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    tls: ssl.SSLContext | None = None,
    script: Script | None = None,
) -> RunningServer:
    """Start a replica on host:port (0 picks a free port), over TLS when `tls` is given, with
    a script of replies when `script` is given."""
    runner = web.AppRunner(make_app(params, script), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    await site.start()
    bound = runner.addresses[0][1]
    return RunningServer(runner=runner, host=host, port=bound, tls=tls is not None)
