"""A real Prometheus (Debian's package) on loopback for tests: free port, temporary storage,
scrape configs given by the test, stopped at the end (and killed if it does not stop)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.support.observability import RULES
from tests.support.servers import free_port


def binary(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} not found: `make test` installs Debian's prometheus package"
    return found


def job(
    name: str,
    targets: Sequence[str],
    labels: Mapping[str, str] | None = None,
    path: str = "/metrics",
) -> dict[str, Any]:
    """A scrape job for ``host:port`` targets, every second."""
    return {
        "job_name": name,
        "metrics_path": path,
        "scrape_interval": "1s",
        "scrape_timeout": "900ms",
        "static_configs": [{"targets": list(targets), "labels": dict(labels or {})}],
    }


class Prometheus:
    def __init__(
        self,
        workdir: Path,
        jobs: Sequence[dict[str, Any]],
        retention: str = "1h",
        flags: Sequence[str] = (),
        evaluation_interval: str = "1m",
    ) -> None:
        """``retention``: longer where the TSDB was backfilled (``workdir/data``) with older
        samples; ``flags``: more of Prometheus's own (its query limits);
        ``evaluation_interval``: Prometheus's own default (1m, docs/configuration), which is
        also a subquery's default resolution (a 1s one hid a kv_oldest that often answered
        nothing); shorter where rules must be evaluated within a test."""
        self.port = free_port()
        self._retention = retention
        self.url = f"http://127.0.0.1:{self.port}"
        self._workdir = workdir
        self._jobs = list(jobs)
        self._evaluation = evaluation_interval
        self._flags = list(flags)
        self._process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Prometheus:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": self._evaluation},
            "rule_files": [str(RULES)],
            "scrape_configs": self._jobs,
        }
        config_file = self._workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        self._process = await asyncio.create_subprocess_exec(
            binary("prometheus"),
            f"--config.file={config_file}",
            f"--storage.tsdb.path={self._workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            f"--storage.tsdb.retention.time={self._retention}",
            "--log.level=warn",
            *self._flags,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        await self._wait_ready()
        return self

    async def _wait_ready(self) -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(300):  # bounded: 30 s
                try:
                    async with session.get(f"{self.url}/-/ready") as response:
                        if response.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                assert self._process is not None and self._process.returncode is None, (
                    "prometheus exited during start-up"
                )
                await asyncio.sleep(0.1)
        raise AssertionError("prometheus did not become ready in 30 s")

    async def __aexit__(self, *exc: object) -> None:
        if self._process is None or self._process.returncode is not None:
            return
        self._process.terminate()
        try:
            await asyncio.wait_for(self._process.wait(), 10)
        except TimeoutError:
            self._process.kill()
            await self._process.wait()

    async def stop(self) -> None:
        await self.__aexit__()

    async def query(self, promql: str) -> dict[str, Any]:
        url = f"{self.url}/api/v1/query"
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, params={"query": promql}) as r,
        ):
            answer: dict[str, Any] = await r.json()
            return answer

    async def get(self, path: str) -> dict[str, Any]:
        async with aiohttp.ClientSession() as session, session.get(self.url + path) as r:
            answer: dict[str, Any] = await r.json()
            return answer

    async def wait_for(self, promql: str, seconds: float = 20) -> list[dict[str, Any]]:
        """Poll until the query returns at least one series (bounded)."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        while True:
            answer = await self.query(promql)
            result: list[dict[str, Any]] = answer.get("data", {}).get("result", [])
            if answer.get("status") == "success" and result:
                return result
            assert loop.time() - began < seconds, f"no data for {promql!r}: {answer}"
            await asyncio.sleep(0.25)
