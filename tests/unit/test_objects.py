"""Clusters that ExternalProviders define by annotation: URLs held to the allow-list elsewhere
(tests/integration/test_kubernetes.py); here, tokens named from the operator's list only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.kube import objects

TOKENS = {"llm/east-epp": Path("/var/run/secrets/spokes/east-token")}


def provider(name: str, **annotations: str) -> dict[str, Any]:
    keys = {
        "epp": objects.EPP_URL_ANNOTATION,
        "token": objects.TOKEN_ANNOTATION,
        "epp_token": objects.EPP_TOKEN_ANNOTATION,
        "pods": objects.VLLM_URLS_ANNOTATION,
    }
    notes = {keys[k]: v for k, v in annotations.items()}
    return {"metadata": {"name": name, "namespace": "llm", "annotations": notes}}


def test_a_named_token_goes_to_an_in_cluster_epp_over_http() -> None:
    found = objects.map_providers(
        [provider("east", epp="http://epp.llm.svc:9090/metrics", epp_token="east-epp")],
        set(),
        tokens=TOKENS,
    )
    assert found.problems == ()
    (cluster,) = found.defined
    assert cluster.epp_bearer_token_file == TOKENS["llm/east-epp"]
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
        assert "for namespace 'llm' (defined for it: east-epp)" in found.problems[0]


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


def test_a_token_goes_only_to_the_namespace_it_is_keyed_for() -> None:
    """An attack: team B's provider named team A's token and pointed its EPP URL at team B's
    own Service, which received team A's token every tick."""
    theirs = provider("east", epp="http://collector.team-b.svc:9090/metrics", epp_token="east-epp")
    theirs["metadata"]["namespace"] = "team-b"
    found = objects.map_providers([theirs], set(), tokens=TOKENS)
    assert found.defined == ()
    assert "does not define for namespace 'team-b' (defined for it: none)" in found.problems[0]
    shared = {"*/east-epp": TOKENS["llm/east-epp"]}  # the operator said: any namespace's
    (cluster,) = objects.map_providers([theirs], set(), tokens=shared).defined
    assert cluster.epp_bearer_token_file == shared["*/east-epp"]


def test_a_token_keyed_without_its_namespace_is_refused_at_start_up() -> None:
    from pydantic import ValidationError

    from controller.settings import AnnotationURLSettings

    with pytest.raises(ValidationError, match=r"key it namespace/name.*'team-a/east-epp'"):
        AnnotationURLSettings(tokens={"east-epp": Path("/t")})
    AnnotationURLSettings(tokens={"llm/east-epp": Path("/t"), "*/hub": Path("/u")})


def test_one_namespace_defines_at_most_max_clusters_and_the_rest_in_one_line() -> None:
    """An attack: 150 providers of one namespace whose pods hang held every page slot through
    the tick, and another team's clusters missed its deadline; 2,000 defined 2,003 clusters
    unsaid. The first ``max_clusters`` by name define theirs; the rest are one problem."""
    many = [provider(f"p{i:03}", epp=f"http://epp-{i}.llm.svc:9090/metrics") for i in range(40)]
    found = objects.map_providers(list(reversed(many)), set(), max_clusters=32)
    assert [c.name for c in found.defined] == [f"llm/p{i:03}" for i in range(32)]
    (problem,) = found.problems
    assert problem.startswith("8 ExternalProvider(s) beyond kubernetes.annotation_urls")
    assert problem.endswith("first llm/p032")
