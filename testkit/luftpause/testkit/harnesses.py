"""The real agent harnesses, Claude Code and Codex, run offline against a local stack.

Shell module, for tests and benchmarks. `make install` puts both, at the versions
`harnesses/package.json` pins, under `harnesses/node_modules` (`LUFTPAUSE_HARNESSES` names
another directory holding `claude` and `codex`). Each run gets a home of its own, so no user
settings, credentials or sessions leak in or out, and is bounded in time: past its timeout
the harness and everything it started are killed.

- Claude Code in print mode (`claude -p`), its model at `ANTHROPIC_BASE_URL` (the dataplane's
  Messages API), nonessential traffic, telemetry and the updater off; `--mcp-config` with
  `--strict-mcp-config` for MCP servers, `--allowedTools` for the tools it may use unasked.
- Codex in exec mode (`codex exec --skip-git-repo-check`), a `config.toml` under `CODEX_HOME`
  naming a model provider at the dataplane (`wire_api = "responses"`) and its MCP servers
  (approved without asking), analytics, the app and plugin features and update checks off.

`start_harness_stack` starts what they run against: simulated engines (a script of replies makes
their sessions run the same way every time), a scheduler, a translating and a passing dataplane,
and the MCP runtime, all behind one token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from luftpause.common.auth import TOKEN_ENV
from luftpause.testkit.stack import SIM_MODEL, Endpoint, Launcher, start_runtime, write_endpoints

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "harnesses" / "package.json"
NAMES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}
KEY_ENV = "LUFTPAUSE_KEY"


def bin_dir() -> Path:
    """Where the harness executables are."""
    override = os.environ.get("LUFTPAUSE_HARNESSES")
    return Path(override) if override else ROOT / "harnesses" / "node_modules" / ".bin"


def executable(name: str) -> Path:
    """The harness `name` (claude or codex); FileNotFoundError, saying how to install it."""
    path = bin_dir() / name
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(
            f"{path} is missing: run `make install` (npm installs the harnesses)"
        )
    return path


def pinned(name: str) -> str:
    """The version of harness `name` that harnesses/package.json pins."""
    return str(json.loads(PACKAGE.read_text())["dependencies"][NAMES[name]])


@dataclass(frozen=True, slots=True, kw_only=True)
class Ran:
    """A harness run: how it ended, what it printed, how long it took."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def json(self) -> Any:
        """Its stdout as JSON (Claude Code's `--output-format json`)."""
        return json.loads(self.stdout)


async def _run(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float) -> Ran:
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except (TimeoutError, asyncio.CancelledError):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the harness and its tools
        await proc.wait()
        raise
    return Ran(
        returncode=proc.returncode or 0,
        stdout=out.decode("utf-8", "replace"),
        stderr=err.decode("utf-8", "replace"),
        seconds=time.perf_counter() - started,
    )


def _base_env(home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    keep = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    return {**env, "HOME": str(home), "NO_COLOR": "1"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaudeCode:
    """Claude Code against a dataplane at `base_url` (no /v1), its key `api_key`."""

    base_url: str
    home: Path
    api_key: str = "luftpause"
    model: str = "luftpause-sim"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {
            **_base_env(self.home),
            "ANTHROPIC_BASE_URL": self.base_url,
            "ANTHROPIC_API_KEY": self.api_key,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            **(extra or {}),
        }

    def mcp_config(self, name: str, url: str, headers: Mapping[str, str] | None = None) -> Path:
        """An MCP config file naming one Streamable HTTP server (with headers, which Claude Code
        expands `${VAR}` in from its environment)."""
        server: dict[str, Any] = {"type": "http", "url": url}
        if headers:
            server["headers"] = dict(headers)
        self.home.mkdir(parents=True, exist_ok=True)
        path = self.home / f"mcp-{name}.json"
        path.write_text(json.dumps({"mcpServers": {name: server}}))
        return path

    async def run(
        self,
        prompt: str,
        *,
        cwd: Path,
        allowed_tools: Sequence[str] = (),
        mcp_config: Path | None = None,
        extra_env: Mapping[str, str] | None = None,
        timeout: float = 120.0,
    ) -> Ran:
        """`claude -p prompt` in `cwd`, its result as JSON on stdout."""
        argv = [str(executable("claude")), "-p", prompt, "--model", self.model]
        argv += ["--output-format", "json"]
        if mcp_config is not None:
            argv += ["--mcp-config", str(mcp_config), "--strict-mcp-config"]
        if allowed_tools:
            argv += ["--allowedTools", ",".join(allowed_tools)]
        return await _run(argv, env=self.env(extra_env), cwd=cwd, timeout=timeout)


def _toml(value: Any) -> str:
    """A TOML value for the few kinds a Codex config here holds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)  # strings and numbers: TOML's basic forms are JSON's


@dataclass(frozen=True, slots=True, kw_only=True)
class Codex:
    """Codex against a dataplane at `base_url` (no /v1), its key `api_key`."""

    base_url: str
    home: Path
    api_key: str = "luftpause"
    model: str = "luftpause-sim"

    @property
    def codex_home(self) -> Path:
        return self.home / ".codex"

    def configure(self, mcp: Mapping[str, str] | None = None, *, mcp_token_env: str = "") -> Path:
        """Write `config.toml`: the dataplane as the model provider, `mcp` (name -> URL) as MCP
        servers, their bearer from the variable `mcp_token_env` when given."""
        lines = [
            f"model = {_toml(self.model)}",
            'model_provider = "luftpause"',
            'approval_policy = "never"',
            "check_for_update_on_startup = false",
            "",
            "[model_providers.luftpause]",
            'name = "luftpause"',
            f"base_url = {_toml(self.base_url + '/v1')}",
            'wire_api = "responses"',
            f"env_key = {_toml(KEY_ENV)}",
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[features]",
            *(f"{name} = false" for name in ("apps", "plugins", "plugin_sharing", "remote_plugin")),
            "in_app_updates = false",
        ]
        for name, url in (mcp or {}).items():
            lines += ["", f"[mcp_servers.{name}]", f"url = {_toml(url)}"]
            lines.append('default_tools_approval_mode = "approve"')
            if mcp_token_env:
                lines.append(f"bearer_token_env_var = {_toml(mcp_token_env)}")
        self.codex_home.mkdir(parents=True, exist_ok=True)
        path = self.codex_home / "config.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {
            **_base_env(self.home),
            "CODEX_HOME": str(self.codex_home),
            KEY_ENV: self.api_key,
            **(extra or {}),
        }

    async def run(
        self,
        prompt: str,
        *,
        cwd: Path,
        sandbox: str = "read-only",
        extra_env: Mapping[str, str] | None = None,
        timeout: float = 120.0,
    ) -> Ran:
        """`codex exec prompt` in `cwd`; its last message on stdout."""
        argv = [str(executable("codex")), "exec", "--skip-git-repo-check", "--sandbox", sandbox]
        argv.append(prompt)
        return await _run(argv, env=self.env(extra_env), cwd=cwd, timeout=timeout)


# --- the stack they run against -----------------------------------------------------------------

# Simulated engines a harness's session runs on at a fast pace: GPU-class step costs, time ten
# times faster, and a KV pool that holds a harness's long system prompt and its reserved reply
# (Claude Code asks for up to 32,000 tokens).
ENGINE_ARGS = ("--profile", "gpu", "--time-scale", "10", "--kv-tokens", "400000")


@dataclass(frozen=True, slots=True, kw_only=True)
class HarnessStack:
    """Two simulated engines, a scheduler, two dataplanes and the MCP runtime (with fake-mcp's
    tools), with a token. `dataplane` translates the Messages and Responses APIs to Chat
    Completions; `native` (same scheduler and engines) passes them through, its endpoint file
    saying the engines serve all three."""

    token: str
    dataplane: str
    native: str
    mcp: str
    runtime: str
    scheduler_status: str
    engines: tuple[str, ...]

    async def script(self, script: Mapping[str, Any] | None) -> None:
        """Give every engine this script of replies (None: none)."""
        async with aiohttp.ClientSession() as http:
            for engine in self.engines:
                async with http.post(engine + "/debug/script", json=script) as resp:
                    if resp.status != 200:
                        raise ValueError(f"{engine} refused the script: {await resp.text()}")

    async def requests(self) -> list[list[dict[str, Any]]]:
        """What each engine received since its last reset (`reset`)."""
        out = []
        async with aiohttp.ClientSession() as http:
            for engine in self.engines:
                async with http.get(engine + "/debug/requests") as resp:
                    out.append((await resp.json())["requests"])
        return out

    async def runs(self) -> list[dict[str, Any]]:
        """The runtime's run tree (`GET /status`), roots first."""
        headers = {"Authorization": f"Bearer {self.token}"}
        async with (
            aiohttp.ClientSession() as http,
            http.get(self.runtime + "/status", headers=headers) as resp,
        ):
            resp.raise_for_status()
            tree: list[dict[str, Any]] = (await resp.json())["tree"]
        return tree

    async def reset(self) -> None:
        """Clear the engines' request logs and counters."""
        async with aiohttp.ClientSession() as http:
            for engine in self.engines:
                async with http.post(engine + "/debug/reset") as resp:
                    resp.raise_for_status()


async def start_harness_stack(
    exits: AsyncExitStack,
    workdir: Path,
    *,
    token: str = "harness-token",
    engine_args: Sequence[str] = ENGINE_ARGS,
    tool_seconds: float = 0.05,
) -> HarnessStack:
    """The stack a harness session runs against (see `HarnessStack`), stopped when `exits`
    closes."""
    launcher = Launcher(workdir, exits)
    env = {TOKEN_ENV: token}
    engines = [await launcher.engine(f"engine-{i}", *engine_args) for i in range(2)]
    config = write_endpoints(workdir / "endpoints.yaml", engines)
    all_apis = {"apis": ["chat", "messages", "responses"]}
    native_config = write_endpoints(
        workdir / "endpoints-native.yaml",
        [Endpoint(id=e.id, url=e.url, models=e.models, options=all_apis) for e in engines],
    )
    scheduler = await launcher.scheduler(config, ready="/ready")
    dataplane = await launcher.dataplane(scheduler, config=config, env=env, ready="/ready")
    native = await launcher.dataplane(
        scheduler, name="dataplane-native", config=native_config, env=env, ready="/ready"
    )
    runtime = await start_runtime(
        exits, workdir, dataplane.url, tool_seconds=tool_seconds, model=SIM_MODEL, env=env
    )
    return HarnessStack(
        token=token,
        dataplane=dataplane.url,
        native=native.url,
        mcp=runtime.mcp_url,
        runtime=runtime.url,
        scheduler_status=scheduler.status_url,
        engines=tuple(e.url for e in engines),
    )
