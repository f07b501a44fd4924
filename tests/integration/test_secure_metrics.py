"""In a cluster /metrics and /debug/state are HTTPS and only for callers the API server
vouches for (TokenReview) and allows (SubjectAccessReview), as controller-runtime's secure
metrics are; the probes stay open. Against the API-server double, over real TLS."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio import client

from controller.app import Controller
from controller.fakes.clusters import Fleet, SimCluster
from controller.kube.access import CACHE_ENTRIES, AccessReviewer
from controller.settings import build_settings
from tests.support.apiserver import FakeAPIServer


def self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


@pytest.fixture
async def secured(
    apiserver: FakeAPIServer, tmp_path: Path
) -> AsyncIterator[tuple[str, ssl.SSLContext]]:
    apiserver.users = {
        "prom-token": "system:serviceaccount:openshift-monitoring:prometheus-k8s",
        "nobody-token": "system:serviceaccount:default:nobody",
    }
    apiserver.grants = {("system:serviceaccount:openshift-monitoring:prometheus-k8s", "/metrics")}
    cert, key = self_signed(tmp_path)
    trust = ssl.create_default_context(cafile=str(cert))
    async with (
        Fleet([SimCluster("a", kv=0.3)]) as sims,
        client.ApiClient(client.Configuration(host=apiserver.url)) as api,
    ):
        settings = build_settings(
            {
                "interval": 1,
                "clusters": sims.settings_clusters(),
                "scrape": {"timeout": 0.5},
                "server": {
                    "bind": "127.0.0.1:0",
                    "tls_cert_file": str(cert),
                    "tls_key_file": str(key),
                    "authenticate": True,
                },
            }
        )
        async with Controller(settings, api=api) as controller:
            await controller.once()
            yield f"https://127.0.0.1:{controller.port}", trust


async def get(url: str, trust: ssl.SSLContext | bool, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers=headers, ssl=trust) as r,
    ):
        await r.read()
        return r.status


async def test_metrics_need_a_token_the_api_server_accepts_and_allows(
    secured: tuple[str, ssl.SSLContext], apiserver: FakeAPIServer
) -> None:
    base, trust = secured
    assert await get(f"{base}/metrics", trust) == 401  # no token
    assert await get(f"{base}/metrics", trust, "forged") == 401  # TokenReview says no
    assert await get(f"{base}/metrics", trust, "nobody-token") == 403  # authenticated, not allowed
    assert await get(f"{base}/metrics", trust, "prom-token") == 200
    assert await get(f"{base}/debug/state", trust, "prom-token") == 403  # only /metrics granted
    for probe in ("/healthz", "/readyz"):
        assert await get(f"{base}{probe}", trust) == 200  # the kubelet sends no token
    reviews = [path for method, path, _, _ in apiserver.requests if method == "POST"]
    assert any(p.endswith("/tokenreviews") for p in reviews)
    assert any(p.endswith("/subjectaccessreviews") for p in reviews)


async def test_the_answer_is_cached_and_plain_http_is_refused(
    secured: tuple[str, ssl.SSLContext], apiserver: FakeAPIServer
) -> None:
    base, trust = secured
    for _ in range(5):
        assert await get(f"{base}/metrics", trust, "prom-token") == 200
    reviews = [
        p for m, p, _, _ in apiserver.requests if m == "POST" and p.endswith("/tokenreviews")
    ]
    assert len(reviews) == 1  # one review for five scrapes
    with pytest.raises(aiohttp.ClientError):
        await get(base.replace("https://", "http://") + "/metrics", False, "prom-token")


@pytest.mark.parametrize("apiserver", ["v0.2.1"], indirect=True)  # reviews are no CRD's
async def test_made_up_tokens_never_evict_a_real_scrapers_answer(
    apiserver: FakeAPIServer,
) -> None:
    """1,500 made-up tokens (one TokenReview each) evicted the real scraper's cached answer,
    so the next real scrape cost the API server a review again. Refused tokens are kept apart
    from accepted ones, and reviews go a few at a time."""
    apiserver.users = {"prom-token": "system:serviceaccount:openshift-monitoring:prometheus-k8s"}
    apiserver.grants = {("system:serviceaccount:openshift-monitoring:prometheus-k8s", "/metrics")}
    async with client.ApiClient(client.Configuration(host=apiserver.url)) as api:
        reviewer = AccessReviewer(api, timeout=5)
        assert await reviewer.status("prom-token", "/metrics") == 200
        made_up = [reviewer.status(f"forged-{i}", "/metrics") for i in range(CACHE_ENTRIES + 476)]
        assert set(await asyncio.gather(*made_up)) == {401}
        before = len(apiserver.requests)
        assert await reviewer.status("prom-token", "/metrics") == 200
    assert len(apiserver.requests) == before  # answered from the cache
    assert len(reviewer.accepted) == 1 and len(reviewer.unknown) == CACHE_ENTRIES


async def test_status_reads_a_deployed_controller_with_a_token_and_its_ca(
    secured: tuple[str, ssl.SSLContext], apiserver: FakeAPIServer, tmp_path: Path
) -> None:
    """`status` had no token or CA option: against the HTTPS, token-protected server the
    manifests deploy it failed with CERTIFICATE_VERIFY_FAILED, while the runbooks sent
    operators to it."""
    base, _ = secured
    apiserver.users["oncall-token"] = "oncall"
    apiserver.grants.add(("oncall", "/debug/state"))
    token = tmp_path / "token"
    token.write_text("oncall-token\n")
    command = [sys.executable, "-m", "controller", "status", "--url", base]
    verified = [*command, "--token-file", str(token), "--ca-file", str(tmp_path / "tls.crt")]
    done = await asyncio.create_subprocess_exec(
        *verified, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(done.communicate(), 60)
    assert done.returncode == 0, err.decode()
    assert "CLUSTER" in out.decode() and " a " in out.decode()
    unverified = await asyncio.create_subprocess_exec(
        *command, "--token-file", str(token), stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(unverified.communicate(), 60)
    assert unverified.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in err.decode()


def test_a_key_of_another_certificate_is_refused_at_start_up_naming_the_field(
    tmp_path: Path,
) -> None:
    """Found by an attack: check-config took a certificate with another's key (or a file
    that is no PEM), and run then failed with "[X509: KEY_VALUES_MISMATCH]", no field named."""
    (one, two) = (tmp_path / "one", tmp_path / "two")
    one.mkdir()
    two.mkdir()
    (cert, _), (_, other) = self_signed(one), self_signed(two)
    config = tmp_path / "config.yaml"
    config.write_text(
        "clusters: [{name: a, vllm_urls: ['http://127.0.0.1:1/']}]\n"
        f"server: {{bind: '127.0.0.1:0', tls_cert_file: {cert}, tls_key_file: {other}}}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "controller", "check-config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"config error: server.tls_cert_file: {cert} with server.tls_key_file {other}" in (
        done.stderr
    )
    assert "KEY_VALUES_MISMATCH" in done.stderr
