"""Clusters that ExternalProviders define by annotation: URLs held to the allow-list elsewhere
(tests/integration/test_kubernetes.py); here, tokens named from the operator's list only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controller.kube import objects

TOKENS = {"east-epp": Path("/var/run/secrets/spokes/east-token")}


def provider(name: str, **annotations: str) -> dict[str, Any]:
    keys = {
        "epp": objects.EPP_URL_ANNOTATION,
        "token": objects.TOKEN_ANNOTATION,
        "epp_token": objects.EPP_TOKEN_ANNOTATION,
        "pods": objects.VLLM_URLS_ANNOTATION,
    }
    return {"metadata": {"name": name, "annotations": {keys[k]: v for k, v in annotations.items()}}}


def test_a_named_token_goes_to_an_in_cluster_epp_over_http() -> None:
    found = objects.map_providers(
        [provider("east", epp="http://epp.llm.svc:9090/metrics", epp_token="east-epp")],
        set(),
        tokens=TOKENS,
    )
    assert found.problems == ()
    (cluster,) = found.defined
    assert cluster.epp_bearer_token_file == TOKENS["east-epp"]
    assert cluster.token_over_cluster_network and cluster.bearer_token_file is None


def test_a_token_is_named_never_given_as_a_path() -> None:
    for wanted in ("/var/run/secrets/kubernetes.io/serviceaccount/token", "nope"):
        found = objects.map_providers(
            [provider("east", epp="https://epp.example.com/metrics", token=wanted)],
            set(),
            tokens=TOKENS,
        )
        assert found.defined == ()
        assert "kubernetes.annotation_urls.tokens does not define" in found.problems[0]
        assert "(defined: east-epp)" in found.problems[0]


def test_a_named_token_never_goes_over_http_out_of_the_cluster() -> None:
    found = objects.map_providers(
        [provider("east", pods="http://10.1.2.3:8000/metrics", token="east-epp")],
        set(),
        tokens=TOKENS,
    )
    assert found.defined == ()
    assert "plain http to 10.1.2.3" in found.problems[0]


def test_without_a_token_annotation_nothing_is_sent() -> None:
    found = objects.map_providers([provider("east", epp="http://epp.llm.svc:9090/m")], set())
    (cluster,) = found.defined
    assert cluster.bearer_token_file is None and cluster.epp_bearer_token_file is None
    assert not cluster.token_over_cluster_network
