"""The daemon as a child process, the way the image and the README run it: its config written
to a file, its /debug/state read over HTTP, stopped with SIGTERM (killed if it will not)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

CONTROLLER = (sys.executable, "-m", "controller")


class Daemon:
    """``weight-controller <args> --config <file>``; ``config`` is a mapping (written as JSON,
    which YAML reads) or the file's text. ``port`` is its metrics port, read from
    ``server.bind`` when the config is a mapping."""

    def __init__(
        self,
        config_path: Path,
        config: Mapping[str, Any] | str,
        *args: str,
        env: Mapping[str, str | None] | None = None,
    ) -> None:
        """``env`` adds to the environment; a name mapped to ``None`` is removed from it."""
        text = config if isinstance(config, str) else json.dumps(config)
        config_path.write_text(text)
        self.args = (*args, "--config", str(config_path))
        merged: dict[str, str | None] = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.env = {k: v for k, v in merged.items() if v is not None}
        bind = config.get("server", {}).get("bind", "") if not isinstance(config, str) else ""
        self.port = int(bind.rpartition(":")[2]) if bind else None
        self.process: asyncio.subprocess.Process | None = None
        self._readers: list[asyncio.Task[bytes]] = []
        self.out = b""
        self.err = b""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def returncode(self) -> int | None:
        return self.process.returncode if self.process is not None else None

    async def start(self) -> Daemon:
        self.process = await asyncio.create_subprocess_exec(
            *CONTROLLER,
            *self.args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )
        # Read both pipes as the child writes, so a chatty daemon never blocks on a full pipe.
        streams = (self.process.stdout, self.process.stderr)
        self._readers = [asyncio.create_task(s.read()) for s in streams if s is not None]
        return self

    async def finish(self, seconds: float = 60) -> int:
        """Wait for the process to exit by itself; its output is in ``out`` and ``err``."""
        assert self.process is not None
        await asyncio.wait_for(self.process.wait(), seconds)
        self.out, self.err = [await reader for reader in self._readers]
        assert self.process.returncode is not None
        return self.process.returncode

    async def stop(self, seconds: float = 20, signum: int = signal.SIGTERM) -> float:
        """SIGTERM (or ``signum``), then wait for the exit; how long it took (loop time)."""
        assert self.process is not None
        loop = asyncio.get_running_loop()
        began = loop.time()
        self.process.send_signal(signum)
        await self.finish(seconds)
        return loop.time() - began

    async def kill(self) -> None:
        """SIGKILL, if it still runs (no clean-up in the child: no Lease released)."""
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.finish()

    async def state(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        async with session.get(self.url + "/debug/state") as response:
            state: dict[str, Any] = await response.json()
            return state

    async def wait_for_ticks(self, ticks: int, seconds: float = 60) -> dict[str, Any]:
        """/debug/state once the daemon has ticked ``ticks`` times (bounded; a daemon that
        exits meanwhile fails the test with what it wrote to stderr)."""
        async with aiohttp.ClientSession() as session:
            for _ in range(int(seconds / 0.2)):
                if self.returncode is not None:
                    await self.finish()
                    raise AssertionError(f"the daemon exited {self.returncode}: {self.err!r}")
                try:
                    state = await self.state(session)
                    if state["ticks"] >= ticks:
                        return state
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        raise AssertionError(f"the daemon did not reach tick {ticks} in {seconds} s")

    async def wait_ready(self, seconds: float = 20) -> None:
        """/readyz answers 200 (bounded)."""
        async with aiohttp.ClientSession() as session:
            for _ in range(int(seconds / 0.1)):
                try:
                    async with session.get(self.url + "/readyz") as response:
                        if response.status == 200:
                            return
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.1)
        raise AssertionError("the daemon never became ready")

    def events(self) -> list[dict[str, Any]]:
        """Its JSON log lines (stdout), once it has exited."""
        return [json.loads(x) for x in self.out.decode().splitlines() if x.startswith("{")]
