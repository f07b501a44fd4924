"""The settings' schema: one typed ``Settings`` with nested groups, validated once at start-up.

Every field's description gives the reason for its default (and ``config/example.yaml``, tested
field for field against this schema, is the reference an operator reads). Loading a file and the
environment is ``loading``; checks between fields and of the files the settings name are
``checks``. Nothing here reads globals at import time.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.networks import HttpUrl as _PydanticHttpUrl
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from controller.engines import AUTO, ENGINES, Engine, Family, Pool, parse_family
from controller.settings import checks
from controller.settings.durations import (
    API_TIMEOUT,
    INTERVAL,
    MAX_STALENESS,
    RENEW_DEADLINE,
    RETRY_PERIOD,
    SCRAPE_TIMEOUT,
    Duration,
    DurationOrZero,
    default_staleness,
    parse_duration,
    seconds,
)
from controller.settings.queries import MAX_WINDOW, PrometheusQueries, default_templates

ENV_PREFIX = "WEIGHT_CONTROLLER_"

LEASE_SECONDS_MAX = 2**31 - 1  # coordination.k8s.io/v1 LeaseSpec.leaseDurationSeconds: int32
MIN_INTERVAL, MAX_INTERVAL = 0.1, 3600.0


def _in_cluster_name(host: str) -> bool:
    """A Service name of this cluster: ``name.namespace.svc`` or ``….svc.cluster.local``."""
    labels = host.lower().rstrip(".").split(".")
    return len(labels) >= 3 and (labels[-1] == "svc" or labels[-3:] == ["svc", "cluster", "local"])


def _duration(metadata: Any) -> bool:
    return any(isinstance(m, BeforeValidator) and m.func is parse_duration for m in metadata)


def _numeric(annotation: Any) -> bool:
    """``annotation`` takes a number and no boolean (``int``, ``float``, in a union, under
    ``Annotated``); a duration says itself what it makes of one."""
    if annotation in (int, float):
        return True
    args = get_args(annotation)
    return not _duration(args) and bool not in args and any(_numeric(a) for a in args)


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML reads ``yes``, ``on`` and ``true`` as a boolean, which pydantic takes for 1 in a
        number field (an attack: ``floor: yes`` was a floor of 1)."""
        field = cls.model_fields.get(info.field_name or "")
        if (
            isinstance(value, bool)
            and field is not None
            and _numeric(field.annotation)
            and not _duration(field.metadata)
        ):
            raise ValueError(
                f"{str(value).lower()}: a boolean, not a number (YAML reads yes/no, on/off "
                "and true/false as one)"
            )
        return value


_LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
_NAMESPACE = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"  # a DNS-1123 label, as Kubernetes names one


def _ip(host: str) -> bool:
    """``host`` is an IP address: v4, or v6 bare or in one pair of brackets (``[::1]``; a
    review found ``[127.0.0.1]`` and ``::1]`` taken, then found nothing)."""
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        found = ipaddress.ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        return False
    return found.version == 6 or not bracketed


def _host_name(host: str) -> str:
    """A host a client can ask for: an IP address, or a name that encodes as a DNS name (no
    empty label, none over 63 characters) of letters, digits, ``-``, ``_`` and dots. The IDNA
    codec raised UnicodeError on every fetch or lookup of ``a..b`` (``internal``: found by
    attacks on URLs, then on ``pods.dns``); ``localhost:8000`` where a name goes found
    nothing, said nowhere."""
    if _ip(host):
        return host
    try:
        encoded = host.encode("idna")
    except UnicodeError as exc:
        raise ValueError(f"{host!r} is not a host name: {exc}") from None
    if not re.fullmatch(rb"[A-Za-z0-9_.-]+", encoded):
        raise ValueError(f"{host!r} is not a host name: only letters, digits, '-', '_', dots")
    return host


def _dialable(url: _PydanticHttpUrl) -> _PydanticHttpUrl:
    _host_name(url.host or "")
    return url


def _dns_name(name: str) -> str:
    """A name a resolver can be asked for (``pods.dns``): a host name (``_host_name``), no
    bracketed address, at most 253 characters as asked (longer, the system resolver found
    nothing and said nothing)."""
    _host_name(name)
    if name.startswith("[") or len(name.rstrip(".").encode("idna")) > 253:
        raise ValueError(f"{name[:64]!r} is not a DNS name: a bracket, or over 253 characters")
    return name


HttpUrl = Annotated[_PydanticHttpUrl, AfterValidator(_dialable)]
HostName = Annotated[str, AfterValidator(_dns_name)]


def _ip_port(value: str) -> str:
    """``ip:port`` (``[v6]:port``), the port a UDP port can be: an address, not a name (a
    name is what the server is asked to resolve, and its answers are matched to the address
    they came from)."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not ip:port with a port of 1-65535")
    if not _ip(host):
        raise ValueError(f"{value!r}: {host!r} is not an IP address")
    return value


IPPort = Annotated[str, AfterValidator(_ip_port)]


def _label_names(value: dict[str, str]) -> dict[str, str]:
    for name in value:
        if not re.fullmatch(_LABEL_NAME, name):
            raise ValueError(f"not a label name: {name!r}")
        if name.startswith("__"):  # found by an attack: __name__ dropped every other signal
            raise ValueError(f"{name!r}: labels starting __ are Prometheus's own, not a matcher")
    return value


def _base(url: _PydanticHttpUrl) -> _PydanticHttpUrl:
    """A querier's base URL, to which ``/api/v1/query`` is added: one with a query or a
    fragment had the path land inside them, and every query failed (found by an attack)."""
    if url.query is not None or url.fragment is not None:  # "…/?" too
        raise ValueError(f"{str(url)!r}: a base URL, without ?query or #fragment")
    return url


QuerierUrl = Annotated[HttpUrl, AfterValidator(_base)]


Matchers = Annotated[dict[str, str], AfterValidator(_label_names)]
"""PromQL label matchers, name → value (equality)."""


def _family(value: str | None) -> str | None:
    if value is not None:
        parse_family(value)  # a ValueError names what is wrong
    return value


class EnginePoolSettings(_Group):
    """How a user-defined engine's pods say what their KV cache holds: exactly one of an
    info gauge's labels (``info`` with ``block_label`` and ``count_label``), two gauges
    multiplied (``block`` × ``count``), or one gauge in tokens (``tokens``)."""

    info: str | None = Field(default=None, description="An info-style gauge's name.")
    block_label: str | None = Field(default=None, pattern=_LABEL_NAME)
    count_label: str | None = Field(default=None, pattern=_LABEL_NAME)
    engine_label: str = Field(
        default="", description="The label that tells a pod's engine processes apart, if any."
    )
    block: str | None = Field(default=None, description="Tokens per block: name{label=value}.")
    count: str | None = Field(default=None, description="Blocks in the pool: name{label=value}.")
    tokens: str | None = Field(default=None, description="Tokens in the pool: name{…}.")

    _families = field_validator("info", "block", "count", "tokens")(_family)

    @model_validator(mode="after")
    def _one_rule(self) -> Self:
        rules = [
            self.info is not None,
            self.block is not None or self.count is not None,
            self.tokens is not None,
        ]
        if sum(rules) != 1:
            raise ValueError("give exactly one of info, block with count, or tokens")
        if self.info is not None and not (self.block_label and self.count_label):
            raise ValueError("info needs block_label and count_label")
        if (self.block is None) != (self.count is None):
            raise ValueError("block and count go together")
        return self

    def pool(self) -> Pool:
        def family(text: str | None) -> Family | None:
            return parse_family(text) if text is not None else None

        return Pool(
            info=parse_family(self.info).names[0] if self.info else None,
            block_label=self.block_label or "",
            count_label=self.count_label or "",
            engine_label=self.engine_label,
            block=family(self.block),
            count=family(self.count),
            tokens=family(self.tokens),
        )


class EngineSettings(_Group):
    """An engine of your own, as llm-d-router's engine configs allow: each signal a metric
    family, ``name`` or ``name{label="value",…}`` (a value of "" also matches a series
    without the label, as in PromQL)."""

    name: str = Field(
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="What clusters[].engine names it by; not a built-in row's name.",
    )
    kv: str = Field(description="KV-cache use, a fraction 0..1 of the pool.")
    waiting: str = Field(description="Requests waiting.")
    running: str = Field(description="Requests running.")
    latency: str | None = Field(
        default=None,
        pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$",
        description="An end-to-end latency histogram (its name, without _bucket).",
    )
    model_label: str = Field(default="model_name", pattern=_LABEL_NAME)
    completed: str | None = Field(
        default=None,
        pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$",
        description="Without a latency histogram: a counter of requests completed, so a URL "
        "answering as several processes is named load_balanced.",
    )
    pool: EnginePoolSettings | None = Field(
        default=None, description="How a pod's KV pool size is read; none: it is measured."
    )

    _families = field_validator("kv", "waiting", "running")(_family)

    @field_validator("name")
    @classmethod
    def _not_built_in(cls, value: str) -> str:
        if value == AUTO or value in ENGINES:
            raise ValueError(f"{value!r} is a built-in engine's name (or auto): choose another")
        return value

    def row(self) -> Engine:
        return Engine(
            name=self.name,
            kv=parse_family(self.kv),
            waiting=parse_family(self.waiting),
            running=parse_family(self.running),
            latency=self.latency,
            model_label=self.model_label,
            pools=(self.pool.pool(),) if self.pool else (),
            completed=self.completed,
        )


class Querier(_Group):
    """A Prometheus or Thanos Querier that holds many clusters' series, told apart by a label
    (ACM observability's hub Thanos: ``cluster``). Every tick each signal is one query for all
    the clusters read through it, grouped by that label and split here: the queries a tick
    sends do not grow with the clusters."""

    name: str = Field(
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="How clusters name this querier (clusters[].prometheus.querier).",
    )
    url: QuerierUrl = Field(description="Base URL of its HTTP API (…/api/v1 is added).")
    cluster_label: str = Field(
        default="cluster",
        pattern=_LABEL_NAME,
        description="The label whose value tells the clusters apart (ACM observability: "
        "cluster, the managed cluster's name).",
    )
    push_interval: Duration = Field(
        default=30.0,
        le=MAX_WINDOW / 4,
        description="How often a cluster's samples reach the querier: a Prometheus's scrape "
        "interval, ACM observability's collection interval (5m by default). Gauges are read "
        "over twice this, rates over at least four times it, and health.max_staleness must "
        "allow twice it.",
    )
    matchers: Matchers = Field(
        default_factory=dict,
        description='Label matchers added to every query, e.g. {namespace: "llm"}.',
    )
    bearer_token_file: Path | None = Field(
        default=None, description="Sent as 'Authorization: Bearer'; re-read when it changes."
    )
    ca_file: Path | None = Field(default=None, description="CA bundle for an https URL.")
    tls_insecure_skip_verify: bool = Field(default=False, description="Off: TLS is verified.")
    timeout: Duration | None = Field(
        default=None, description="Per-query timeout; scrape.timeout if unset."
    )


class PrometheusSource(_Group):
    """Read a cluster through a Prometheus (or Thanos Querier) instead of scraping its pods:
    a querier shared with other clusters (``querier``, one query per signal for all of them),
    or one of its own (``url``, queries of its own every tick)."""

    querier: str | None = Field(
        default=None, description="The queriers[] entry that holds this cluster's series."
    )
    cluster: str | None = Field(
        default=None,
        description="This cluster's value of the querier's cluster label; the cluster's name "
        "if unset.",
    )
    url: QuerierUrl | None = Field(
        default=None,
        description="Or a querier of its own: base URL of its HTTP API (…/api/v1 is added).",
    )
    matchers: Matchers = Field(
        default_factory=dict,
        description="With url: label matchers that select this cluster's series, e.g. "
        '{namespace: "llm"}.',
    )
    push_interval: Duration = Field(
        default=30.0,
        le=MAX_WINDOW / 4,
        description="With url: how often the cluster's samples reach that querier (see "
        "queriers[].push_interval).",
    )
    bearer_token_file: Path | None = Field(
        default=None,
        description="With url: sent as 'Authorization: Bearer'; re-read when it changes.",
    )
    ca_file: Path | None = Field(default=None, description="With url: CA bundle for https.")
    tls_insecure_skip_verify: bool = Field(default=False, description="Off: TLS is verified.")
    timeout: Duration | None = Field(
        default=None, description="With url: per-query timeout; scrape.timeout if unset."
    )

    @model_validator(mode="after")
    def _one_querier(self) -> Self:
        if (self.url is None) == (self.querier is None):
            raise ValueError("give a shared querier or a url of its own, not both or neither")
        own = ("matchers", "bearer_token_file", "ca_file", "timeout", "push_interval")
        if self.querier is not None and any(name in self.model_fields_set for name in own):
            raise ValueError(
                "with querier, matchers, credentials, timeout and push_interval are the "
                "querier's (queriers[])"
            )
        if self.url is not None and self.cluster is not None:
            raise ValueError("cluster is the querier's label value: use matchers with url")
        return self


class ServiceRef(_Group):
    """A Service of the controller's own cluster."""

    namespace: str = Field(description="Namespace of the Service.")
    service: str = Field(description="Name of the Service (its EndpointSlices carry it).")


class PodDiscovery(_Group):
    """Where a cluster's vLLM pods are found, instead of listing them: pods come and go with
    rollouts and autoscaling, and a listed URL goes stale. From the A/AAAA records of a
    headless Service (like Prometheus's ``dns_sd_configs``), or from the EndpointSlices of a
    Service in the controller's own cluster (through the Kubernetes client it already has)."""

    dns: HostName | None = Field(
        default=None,
        description="A name whose A/AAAA records are the pods: a headless Service "
        "(clusterIP: None), e.g. vllm-llama.llm.svc.cluster.local, or a multi-cluster "
        "Service's headless name.",
    )
    endpoint_slices: ServiceRef | None = Field(
        default=None,
        description="A Service of this cluster whose ready endpoints are the pods "
        "(needs kubernetes.enabled and 'list' on endpointslices there).",
    )
    port: int = Field(default=8000, ge=1, le=65535, description="vLLM's port (8000).")
    scheme: Literal["http", "https"] = Field(default="http", description="vLLM serves http.")
    path: str = Field(default="/metrics", pattern=r"^/", description="The metrics path.")
    server_name: HostName | None = Field(
        default=None,
        description="Over https, the name each pod's certificate is checked against (and sent "
        "as SNI): pods are dialed by address, which their certificates rarely name. Unset: the "
        "Service's name, service.namespace.svc (as OpenShift's serving certificates name it), "
        "for endpoint_slices, and the dns name for dns.",
    )
    refresh: Duration = Field(
        default=30.0,
        description="How often the pods are looked up again (a record's TTL, when shorter, "
        "wins): new pods are read within this long of appearing.",
    )
    nameserver: IPPort | None = Field(
        default=None,
        description="ip:port of the DNS server to ask instead of the system resolver (a "
        "split-horizon setup, or tests).",
    )
    max_pods: int = Field(
        default=512,
        ge=1,
        le=10000,
        description="At most this many pods are read per cluster: a record set larger than "
        "any deployment is an error, not a reason to starve the other clusters.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.dns is None) == (self.endpoint_slices is None):
            raise ValueError("give exactly one of dns or endpoint_slices")
        return self

    @property
    def tls_name(self) -> str | None:
        """The name a pod's certificate is checked against: ``server_name``, else the
        Service's or the dns name; ``None`` over http."""
        if self.scheme != "https":
            return None
        if self.server_name is not None:
            return self.server_name
        if self.endpoint_slices is not None:
            return f"{self.endpoint_slices.service}.{self.endpoint_slices.namespace}.svc"
        return None if self.dns is None else self.dns.rstrip(".")


class InferencePoolRef(_Group):
    """An llm-d / Gateway API Inference Extension InferencePool of the controller's own cluster
    (``inference.networking.k8s.io/v1``): its EPP is read at the metrics port of the Service
    ``spec.endpointPickerRef`` names (``endpointPickerRef.port`` is the gRPC port the gateway
    calls, not the metrics one), and its pool averages by the pool's name."""

    namespace: str = Field(
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="The pool's namespace.",
    )
    name: str = Field(
        pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$", max_length=253, description="The pool's name."
    )
    metrics_port: str = Field(
        default="http-metrics",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=15,
        description="The name of the EPP Service's port that serves /metrics: http-metrics in "
        "the inferencepool chart (config/charts/inferencepool/templates/epp-service.yaml, port "
        "9090).",
    )
    scheme: Literal["http", "https"] = Field(
        default="http", description="The EPP serves its metrics over plain HTTP by default."
    )
    path: str = Field(default="/metrics", pattern=r"^/", description="The metrics path.")
    service: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="The EPP Service the pool must name; a pool pointed at another is refused "
        "(unset: whichever it names). Set it where a token goes to the EPP: whoever may edit "
        "the pool could otherwise point it, and the token, at a Service of their own.",
    )

    @property
    def where(self) -> str:
        return f"inferencepool:{self.namespace}/{self.name}"


# A DNS label, or namespace/name (a Kubernetes object's own: a namespace is a DNS label, a
# name a DNS subdomain).
CLUSTER_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[a-z0-9]([-.a-z0-9]*[a-z0-9])?)?$"
CLUSTER_NAME_MAX = 63 + 1 + 253


class ClusterSettings(_Group):
    """One cluster serving the model: where its signals are read."""

    name: str = Field(
        pattern=CLUSTER_NAME_PATTERN,
        max_length=CLUSTER_NAME_MAX,
        description="Names the cluster in logs, metric labels and weights: a DNS label (a "
        "cluster an ExternalProvider's annotations define is named namespace/name).",
    )
    vllm_urls: list[HttpUrl] = Field(
        default_factory=list,
        description="vLLM /metrics pages, one per pod; KV cache, queue and e2e latency. A URL "
        "listed twice counts once.",
    )
    epp_url: HttpUrl | None = Field(
        default=None, description="The EPP /metrics page: request latency and pool averages."
    )
    inference_pool: InferencePoolRef | None = Field(
        default=None,
        description="Instead of epp_url: the InferencePool whose EPP to read, resolved from "
        "the pool and its EPP Service and followed as they change (needs kubernetes.enabled, "
        "and list/watch on inferencepools and services there); pool_name defaults to its name.",
    )
    engine: str = Field(
        default=AUTO,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="What serves the model on the pods (vllm_urls, pods): a row of the engine "
        f"table ({', '.join(ENGINES)}, or one of engines[]), or auto: each page is read by "
        "the first row whose KV-cache family it carries. vllm_urls and pods take any "
        "engine's pages.",
    )
    model_name: str | None = Field(
        default=None,
        min_length=1,  # "" matched only series without the label (an empty value is none)
        description="Only series with this model_name label count; unset reads every model.",
    )
    pool_name: str | None = Field(
        default=None,
        min_length=1,
        description="Only EPP pool-average series with this name label count; unset reads all.",
    )
    bearer_token_file: Path | None = Field(
        default=None,
        description="Sent as 'Authorization: Bearer' to every URL of this cluster; re-read when "
        "it changes (tokens rotate). Refused with a plain http:// URL unless "
        "allow_token_over_http is set.",
    )
    epp_bearer_token_file: Path | None = Field(
        default=None,
        description="A token for the EPP only (it asks for one by default; vLLM pods do not), "
        "so it is never sent to the pods.",
    )
    allow_token_over_http: bool = Field(
        default=False,
        description="Send a bearer token over plain http:// to any host (anyone on the path "
        "can read it); warned about at start-up. Inside one cluster prefer "
        "token_over_cluster_network.",
    )
    token_over_cluster_network: bool = Field(
        default=False,
        description="This cluster's http:// URLs are Services of the controller's own "
        "cluster (*.svc, *.svc.cluster.local), so its token may go to them over the pod "
        "network in plain text: what the EPP asks by default (plain HTTP on 9090, a token "
        "required). Any other http:// host is still refused; warned about at start-up.",
    )
    ca_file: Path | None = Field(
        default=None, description="CA bundle for https URLs; the system store when unset."
    )
    tls_insecure_skip_verify: bool = Field(
        default=False, description="Off: TLS is verified unless an operator opts out here."
    )
    timeout: Duration | None = Field(
        default=None, description="Per-request timeout for this cluster; scrape.timeout if unset."
    )
    kv_tokens_per_pod: int | None = Field(
        default=None,
        gt=0,
        le=10**12,  # past a float's range, a cluster's capacity failed every tick (an attack)
        description="KV-cache tokens one pod holds (num_gpu_blocks × block_size), for a "
        "cluster whose pages do not say: read through its EPP alone, its capacity is then "
        "ready endpoints × this; its pods' pages publishing no pool, answering pods × this. "
        "Unset: such a cluster's pool is measured against the clusters of its target that "
        "publish theirs (tokens a running request holds there), or taken as their smallest pod "
        "before it has load (in pods when none publishes one).",
    )
    pods: PodDiscovery | None = Field(
        default=None,
        description="Discover the vLLM pods (DNS of a headless Service, or EndpointSlices) "
        "instead of listing them in vllm_urls.",
    )
    prometheus: PrometheusSource | None = Field(
        default=None,
        description="Read this cluster's signals with PromQL instead of scraping its pods.",
    )

    @model_validator(mode="before")
    @classmethod
    def _pool_name_of_the_pool(cls, data: Any) -> Any:
        """An InferencePool's EPP labels its pool averages with the pool's name."""
        if isinstance(data, dict) and data.get("pool_name") is None:
            pool = data.get("inference_pool")
            if isinstance(pool, dict) and isinstance(pool.get("name"), str):
                return {**data, "pool_name": pool["name"]}
        return data

    @field_validator("vllm_urls")
    @classmethod
    def _once_each(cls, value: list[HttpUrl]) -> list[HttpUrl]:
        """A URL listed twice is one pod: counted once, or it would weigh as two."""
        seen: dict[str, HttpUrl] = {}
        for url in value:
            seen.setdefault(str(url), url)
        return list(seen.values())

    @model_validator(mode="after")
    def _no_secret_in_the_open(self) -> Self:
        urls = [*self.vllm_urls, *([self.epp_url] if self.epp_url else [])]
        if any(u.username or u.password for u in urls):
            raise ValueError(
                "credentials in a URL would be shown and logged: use bearer_token_file"
            )
        if self.allow_token_over_http:
            return self
        plain = [host for host, scheme in self.tokened() if scheme == "http"]
        if self.token_over_cluster_network:
            plain = [host for host in plain if not _in_cluster_name(host)]
            plain = [
                host for host in plain if self.inference_pool is None or host != self._pool_epp
            ]
        if plain:
            raise ValueError(
                f"a bearer token would go over plain http to {plain[0]}: use https, "
                "epp_bearer_token_file for an https EPP only, token_over_cluster_network: "
                "true for Services of this cluster, or allow_token_over_http: true"
            )
        return self

    def tokened(self) -> list[tuple[str, str]]:
        """(host, scheme) of every address a bearer token would be sent to."""
        found: list[tuple[str, str]] = []
        if self.bearer_token_file:
            found += [(u.host or "", u.scheme) for u in self.vllm_urls]
            if self.pods is not None and self.pods.dns is not None:
                found.append((self.pods.dns, self.pods.scheme))
            elif self.pods is not None and self.pods.endpoint_slices is not None:
                ref = self.pods.endpoint_slices
                found.append((f"{ref.service}.{ref.namespace}.svc", self.pods.scheme))
        epp_token = self.epp_bearer_token_file or self.bearer_token_file
        if epp_token and self.epp_url is not None:
            found.append((self.epp_url.host or "", self.epp_url.scheme))
        if epp_token and self.inference_pool is not None:
            found.append((self._pool_epp, self.inference_pool.scheme))
        return found

    @property
    def _pool_epp(self) -> str:
        """How the EPP Service of ``inference_pool`` is named before it is resolved: always a
        Service of this cluster."""
        assert self.inference_pool is not None
        return f"the EPP Service of InferencePool {self.inference_pool.namespace}/" + (
            self.inference_pool.name
        )

    @model_validator(mode="after")
    def _has_a_source(self) -> Self:
        epp = self.epp_url is not None or self.inference_pool is not None
        scraped = bool(self.vllm_urls) or epp or self.pods is not None
        if self.prometheus is not None and scraped:
            raise ValueError(
                "use either prometheus or vllm_urls/pods/epp_url/inference_pool, not both"
            )
        if self.prometheus is None and not scraped:
            raise ValueError("needs vllm_urls, pods, epp_url, inference_pool or prometheus")
        # what only a page reader reads: through a querier it was silently ignored, and
        # model_name: x read every model's KV as one (found by an attack)
        ignored = [n for n in _PAGES_ONLY if n in self.model_fields_set]
        if self.prometheus is not None and ignored:
            raise ValueError(
                f"{', '.join(ignored)}: read from pages, not through prometheus (its querier's "
                "matchers, credentials and timeout are prometheus's or queriers[]'s)"
            )
        if self.epp_url is not None and self.inference_pool is not None:
            raise ValueError("name the EPP by epp_url or by inference_pool, not both")
        if self.vllm_urls and self.pods is not None:
            raise ValueError("list the pods (vllm_urls) or discover them (pods), not both")
        return self


# A cluster's settings that only its pages are read by (``_has_a_source``).
_PAGES_ONLY = (
    "engine",
    "model_name",
    "pool_name",
    "kv_tokens_per_pod",
    "bearer_token_file",
    "epp_bearer_token_file",
    "ca_file",
    "tls_insecure_skip_verify",
    "allow_token_over_http",
    "token_over_cluster_network",
    "timeout",
)


class ScrapeSettings(_Group):
    timeout: Duration = Field(
        default=SCRAPE_TIMEOUT,
        description="Per-request timeout; well under the interval so a slow pod cannot stall a "
        "tick (unset: 3s, or half the interval when that is shorter).",
    )
    max_body_bytes: int = Field(
        default=10 * 1024 * 1024,
        gt=0,
        description="A /metrics page larger than this is refused while reading: far above a "
        "busy vLLM page, far below what would hurt the process.",
    )
    max_page_samples: int = Field(
        default=20000,
        ge=1000,
        le=10_000_000,
        description="A page with more wanted samples than this is refused while reading "
        "(too_many_samples), as Prometheus's sample_limit fails a scrape: each costs about a "
        "kilobyte while its page is read, so a page of a few megabytes of tiny series would "
        "hold over a hundred. A vLLM pod's page holds ~250, a Ray node's of 16 replicas ~450, "
        "an EPP's ~40 for each model and target model (LoRA adapter) it serves. It bounds a "
        "querier's answer too, in series: its pool queries have one a pod, and each cluster "
        "of it may answer an even share (20000 among 200 clusters: 100 pods each); one past "
        "its share has its own pool refused (too_many_samples), never the others'.",
    )
    max_concurrency: int = Field(
        default=32,
        ge=1,
        le=10000,
        description="Requests in flight at once, over all clusters. A request's timeout starts "
        "when it gets its turn, so a large fleet queues instead of timing itself out; one "
        "connection per slot is kept alive where the server allows it. Each slot holds up "
        "to twice aiohttp's read buffer of body in flight, so more slots cost memory, and "
        "past a few dozen the CPU, not the slots, sets the pace (benchmarks/README.md).",
    )
    max_concurrency_per_cluster: int = Field(
        default=8,
        ge=1,
        le=10000,
        description="Of those, how many one cluster may hold: a cluster with thousands of "
        "pods that never answer waits for its own slots, never for the other clusters'.",
    )
    min_latency_requests: float = Field(
        default=5,
        ge=1,
        description="Fewer requests than this between two scrapes leave latency unknown: a "
        "quantile of a handful of requests is noise.",
    )


class HealthSettings(_Group):
    failures_to_unhealthy: int = Field(
        default=2, ge=1, description="One failed scrape is a blip; two in a row is an outage."
    )
    timeouts_to_unhealthy: int = Field(
        default=5,
        ge=1,
        description="Fetches that only timed out, in a row, before a cluster is unhealthy: a "
        "timeout may be the path to the metrics, not the cluster (Envoy's "
        "consecutive_local_origin_failure, default 5). Staleness still bounds it.",
    )
    successes_to_healthy: int = Field(
        default=2,
        ge=1,
        description="A recovering cluster must prove itself twice before it gets traffic.",
    )
    max_staleness: Duration = Field(
        default=MAX_STALENESS,
        description="Data older than this (sample timestamps, or the last good scrape) is "
        "stale, and the cluster unhealthy, whatever the failure count says. Longer than "
        "interval (unset: 60s, or three intervals when that is longer).",
    )
    min_pod_fraction: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="A cluster stays usable while at least this share of its pods answer "
        "(read as scrape.min_pod_fraction before it moved here).",
    )

    @model_validator(mode="after")
    def _timeouts_weaker(self) -> Self:
        if self.timeouts_to_unhealthy < self.failures_to_unhealthy:
            raise ValueError(
                f"timeouts_to_unhealthy ({self.timeouts_to_unhealthy}) is below "
                f"failures_to_unhealthy ({self.failures_to_unhealthy}): a timeout is weaker "
                "evidence than a refusal or an error page, never stronger"
            )
        return self


MAX_HORIZON = 600.0  # weights.forecast_horizon: no dead time is longer


class WeightSettings(_Group):
    law: Literal["capacity", "integral"] = Field(
        default="capacity",
        description="How targets are computed: 'capacity' (shares follow each cluster's "
        "estimated capacity and the demand it carries; the default) or 'integral' (the "
        "previous law: an integral controller on KV-headroom scores).",
    )
    freeze: bool = Field(
        default=False,
        description="Hold every target's weights as they are (an incident switch): signals "
        "are still read, judged and exported; nothing is written.",
    )
    floor: int = Field(
        default=2,
        ge=0,
        le=50,
        description="Every healthy cluster keeps this much traffic, so its signals stay fresh.",
    )
    max_step: int = Field(
        default=25,
        ge=1,
        le=100,
        description="No healthy cluster's weight moves more than this per tick, so traffic "
        "never lurches; off a saturated cluster whose queue grows (mode emergency) the others "
        "each gain at most this, or their room below pressure if more.",
    )
    deadband: int = Field(
        default=3,
        ge=0,
        le=50,
        description="Moves smaller than this are noise: the weights are not republished.",
    )
    smoothing: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Share of the way to the target taken per tick (1 = no smoothing): a "
        "weight change shows in KV only a scrape, a propagation delay and a request later.",
    )
    # The integral law's shape settings are bounded where their arithmetic stays finite for
    # any reading (an attack found 1e308 accepted, then every tick's weighing overflowing).
    gain: float = Field(
        default=40.0,
        gt=0,
        le=1000,
        description="Integral law: points of weight a cluster's target moves per unit of score "
        "(≈ KV headroom) above or below the fleet's mean. Higher gains turn KV noise into "
        "writes and oscillation; this one settles and still sheds a hot cluster.",
    )
    kv_saturation: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="KV-cache use at which a cluster counts as full: vLLM preempts before 100%.",
    )
    kv_exponent: float = Field(
        default=1.0,
        ge=0.1,
        le=10,
        description="Curvature of the KV headroom score; above 1 sheds load from warm clusters "
        "earlier.",
    )
    queue_reference: float = Field(
        default=4.0,
        ge=0.01,
        le=10_000,
        description="Waiting requests per pod that count as a real queue: a cluster with this "
        "many more than the shortest queue loses about half its weight.",
    )
    queue_sensitivity: float = Field(
        default=1.0, ge=0, le=10, description="Exponent of the queue penalty; 0 ignores queues."
    )
    latency_quantile: Literal["p50", "p90", "mean"] = Field(
        default="p90", description="The latency compared across clusters: the tail users feel."
    )
    latency_sensitivity: float = Field(
        default=0.5,
        ge=0,
        le=10,
        description="Exponent of (fastest / this) latency; 0.5 halves weight at 4x the latency.",
    )

    forecast_horizon: Annotated[DurationOrZero, Field(le=MAX_HORIZON)] = Field(
        default=0,
        description="Dead-time compensation: judge each cluster by its KV this many seconds "
        "ahead, extrapolated from its recent slope (0 = off). Weights act only after a scrape, "
        "a tick and propagation, while KV keeps climbing. At most 10 minutes: further ahead, "
        "any rising noise reads as a full cache (an hour wrote 9 times in 12 ticks).",
    )

    # ---- the capacity law (law: capacity) ----
    pressure: float = Field(
        default=0.8,
        gt=0,
        le=1.5,
        description="Utilization (KV use, times (running + waiting) / running when requests "
        "queue) at which a cluster is under pressure: traffic moves off it to clusters below "
        "this. Below it everywhere, equal-quality clusters are left alone.",
    )
    rebalance: int = Field(
        default=12,
        ge=1,
        le=100,
        description="Points a ref's share may sit away from its capacity-and-demand goal, with "
        "no cluster under pressure, before it is moved anyway (a returning cluster, a share "
        "set by hand). Above the noise of a fleet at rest.",
    )
    demand_smoothing: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Weight of the newest scrape in each cluster's filtered utilization (an "
        "EWMA; 1 = no filter). Pressure is also judged on the newest scrape alone, so a "
        "cluster filling up is seen at once.",
    )
    settle: DurationOrZero | None = Field(
        default=None,
        description="After a change, no further step for at least this long (except to take "
        "traffic off an unhealthy cluster); past it, none until the change is seen acting "
        "(the target's realised share moving: its measured actuation delay, in /debug/state) "
        "and a scrape more. Unset: two intervals (20 s at the default interval); 0: never "
        "wait, not even for the change to act.",
    )

    realised_window: Duration = Field(
        default=300.0,
        description="Window over which each ref's realised share (requests its cluster "
        "served) is compared with the share its weight intended: long enough to hold a few "
        "hundred requests. The capacity law reads it too: a cluster that serves more than its "
        "weight sends it carries traffic of its own, and at rest gains no further than its "
        "fair share.",
    )

    @model_validator(mode="after")
    def _deadband_below_step(self) -> Self:
        if self.deadband >= self.max_step:
            raise ValueError("deadband must be smaller than max_step, or weights never move")
        return self


class ServerSettings(_Group):
    bind: str = Field(
        default="0.0.0.0:8080",
        description="host:port for /metrics, /healthz, /readyz; all interfaces so Prometheus "
        "can reach the pod.",
    )

    probe_bind: str | None = Field(
        default=None,
        description="host:port for /healthz and /readyz alone, plain HTTP and never behind a "
        "token, for the kubelet's probes (controller-runtime's --health-probe-bind-address). "
        "Unset: the probes are served on bind only.",
    )
    tls_cert_file: Path | None = Field(
        default=None,
        description="Serve HTTPS with this certificate (PEM; on OpenShift the service CA's "
        "serving certificate). Re-read when it changes. Unset: plain HTTP.",
    )
    tls_key_file: Path | None = Field(default=None, description="Its private key (PEM).")
    authenticate: bool = Field(
        default=False,
        description="/metrics and /debug/state require a bearer token that the API server "
        "accepts (TokenReview) and allows to 'get' that path (SubjectAccessReview), as "
        "controller-runtime's secure metrics do. /healthz and /readyz stay open for probes.",
    )

    @model_validator(mode="after")
    def _tls_pair(self) -> Self:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        return self

    @model_validator(mode="after")
    def _own_probe_port(self) -> Self:
        """The probes' listener and the main one cannot share a port on one address: the
        second failed to bind at start-up after check-config had passed (a wildcard address
        holds the port on every address)."""
        if self.probe_bind is None:
            return self
        (host, port), (probe_host, probe_port) = map(host_and_port, (self.bind, self.probe_bind))
        wildcard = {"", "0.0.0.0", "::"}
        # two literal addresses, neither a wildcard, are two listeners; a name may be either
        # (a review: localhost and 127.0.0.1 passed, and the second bind failed)
        apart = host != probe_host and not ({host, probe_host} & wildcard)
        if port == probe_port != 0 and not (apart and _ip(host) and _ip(probe_host)):
            raise ValueError(
                f"probe_bind {self.probe_bind!r} takes the port of bind {self.bind!r}: "
                "give the probes a port of their own"
            )
        return self

    @field_validator("bind", "probe_bind")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is None:
            return None
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"expected host:port, got {value!r}")
        _host_name(host)  # 'a..b:8080' passed, then the bind raised UnicodeError at start
        return value

    @property
    def host(self) -> str:
        return host_and_port(self.bind)[0]

    @property
    def port(self) -> int:
        return host_and_port(self.bind)[1]


def host_and_port(bind: str) -> tuple[str, int]:
    """``host:port`` (a checked ``bind``, ``probe_bind`` or ``pods.nameserver``) as host (IPv6
    brackets off) and port."""
    host, _, port = bind.rpartition(":")
    return host.strip("[]"), int(port)


class HTTPRouteTarget(_Group):
    """An HTTPRoute whose backendRef weights follow the clusters they point at."""

    namespace: str = Field(description="Namespace of the HTTPRoute.")
    name: str = Field(description="Name of the HTTPRoute.")
    backends: dict[str, str] = Field(
        min_length=1,
        description="backendRef name → cluster name; refs not listed keep their weight.",
    )


class AnnotationURLSettings(_Group):
    """Where metrics URLs given in ExternalProvider annotations may point."""

    allow: list[str] = Field(
        default_factory=lambda: [
            "*.svc",
            "*.svc.cluster.local",
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "100.64.0.0/10",
            "fd00::/8",
        ],
        description="Host name patterns (fnmatch) and address ranges (CIDR) a URL from an "
        "annotation may name: cluster-internal service names and pod networks by default. "
        "Loopback, link-local, the API server and credentials in URLs are refused whatever "
        "this says.",
    )
    allow_loopback: bool = Field(
        default=False,
        description="Allow loopback URLs (127.0.0.0/8, ::1, localhost): for local runs and "
        "tests only, never in a cluster.",
    )
    max_urls: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="vLLM URLs one ExternalProvider's annotation may list; more refuses the "
        "provider (a team's list must not take the tick from the others; for a large "
        "deployment list its EPP, or configure the cluster with pods discovery).",
    )
    max_clusters: int = Field(
        default=32,
        ge=1,
        le=4096,
        description="Clusters one namespace's ExternalProviders may define (by name; the rest "
        "define none, said in one line): 150 of one namespace whose pods hung held every page "
        "slot through the tick, and another team's clusters missed its deadline.",
    )
    tokens: dict[str, Path] = Field(
        default_factory=dict,
        description="Token files an ExternalProvider's annotations may name (…/bearer-token, "
        "…/epp-bearer-token: a name from here, never a path), mounted from Secrets like a "
        "configured cluster's, each keyed namespace/name: only that namespace's providers "
        "may name it (*/name: any namespace's, which sends it wherever any of them points). "
        "An annotation cannot make the controller send any other file, its own "
        "service-account token included.",
    )

    @field_validator("tokens")
    @classmethod
    def _scoped(cls, value: dict[str, Path]) -> dict[str, Path]:
        """Each token keyed by the namespace whose providers may name it: one any namespace
        could name, team B's provider sent team A's token to team B's own Service (found by
        an attack)."""
        for key in value:
            namespace, _, name = key.partition("/")
            known = namespace == "*" or re.fullmatch(_NAMESPACE, namespace) is not None
            if not (name and known and "/" not in name):
                raise ValueError(
                    f"{key!r}: key it namespace/name, the namespace whose ExternalProviders may "
                    f"name it ('team-a/{name or key}'), or */name for any namespace's, which "
                    "sends it wherever any of their providers points"
                )
        return value

    @field_validator("allow")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if "/" in pattern:
                try:
                    ipaddress.ip_network(pattern, strict=False)
                except ValueError as exc:
                    raise ValueError(f"{pattern!r} is not a CIDR range: {exc}") from None
        return value


class KubernetesSettings(_Group):
    enabled: bool = Field(
        default=False,
        description="Off: weights reach logs and gauges only. On: ExternalModels (and the "
        "HTTPRoutes below) are patched.",
    )
    namespaces: list[str] = Field(
        default_factory=list,
        description="Where opted-in ExternalModels are looked for. Empty (the default): every "
        "namespace, as MaaS keeps ExternalModels in model namespaces (needs the ClusterRole); "
        "a list: only those (namespaced Roles suffice).",
    )
    label_selector: str = Field(
        default="weight-controller.opendatahub.io/managed=true",
        description="ExternalModels opt in with this label; nothing else is touched.",
    )
    httproutes: list[HTTPRouteTarget] = Field(
        default_factory=list, description="HTTPRoutes to steer, for Gateway API users."
    )
    kubeconfig: Path | None = Field(
        default=None,
        description="Outside a pod: this kubeconfig (else $KUBECONFIG or ~/.kube/config).",
    )
    context: str | None = Field(default=None, description="kubeconfig context to use.")
    api_timeout: Duration = Field(
        default=API_TIMEOUT,
        description="Per API call; an API server slower than this counts as down. With leader "
        "election, api_timeout + retry_period must stay under renew_deadline: the leader "
        "writes only with a whole API timeout of its lease left (and a renewal's own round "
        "trips come out of what is left: keep a margin for a slow API server).",
    )
    write_retries: int = Field(
        default=3,
        ge=1,
        le=10,
        description="Re-read and retry a guarded write this often on conflict (409/422).",
    )
    watch: bool = Field(
        default=True,
        description="Keep ExternalModels and ExternalProviders by LIST then WATCH (a cache the "
        "tick reads; a relist only when the watch is gone) instead of listing them every tick.",
    )
    watch_idle: Duration = Field(
        default=90.0,
        gt=0,
        le=600,
        description="A watch that delivers neither an event nor a bookmark for this long is "
        "dropped and the objects listed again: the API server sends a bookmark at least every "
        "minute (its watch cache's defaultBookmarkFrequency), so only a stalled watch or a "
        "proxy that holds it open is this quiet.",
    )
    max_parallel_writes: int = Field(
        default=8,
        ge=1,
        le=64,
        description="Targets written at once. All of a tick's writes share one deadline "
        "(80% of the interval): a slow API costs a tick that long, not a call's timeout per "
        "target, and a write it cuts off is retried next tick (reason api_timeout).",
    )
    annotation_urls: AnnotationURLSettings = Field(default_factory=AnnotationURLSettings)
    # two refs share 100 points: a minimum past 50 leaves every target unwritable
    min_weight: Literal["auto"] | Annotated[int, Field(ge=0, le=50)] = Field(
        default="auto",
        description="The lowest weight an ExternalModel ref may be given. auto: read the "
        "installed CRD's minimum (1 on MaaS v0.2.0, 0 from v0.2.1), or assume 1 when the CRD "
        "cannot be read; a dead cluster then keeps 1 instead of 0.",
    )
    field_manager: str = Field(
        default="weight-controller",
        description="Our name in managedFields, so humans see who wrote the weights.",
    )

    @field_validator("label_selector")
    @classmethod
    def _opted_in(cls, value: str) -> str:
        """A selector that asks for a label: empty, it matched every ExternalModel, and one of
        only ``!key`` or ``key!=value`` matches exactly those that never opted in (found by an
        attack: an unlabelled model's weights were rewritten)."""
        if not any(_asks_for_a_label(term) for term in _selector_terms(value)):
            raise ValueError(
                f"{value!r} selects ExternalModels that never opted in: name a label they "
                "carry (key, key=value or key in (...))"
            )
        return value


def _selector_terms(selector: str) -> list[str]:
    """A label selector's requirements: split at the commas outside ``in (...)`` lists."""
    terms, depth, term = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(term.strip())
            term = ""
        else:
            term += char
    return [t for t in (*terms, term.strip()) if t]


def _asks_for_a_label(term: str) -> bool:
    """``key``, ``key=value``, ``key==value``, ``key in (...)`` need the label; ``!key``,
    ``key!=value`` and ``key notin (...)`` are met by an object without it
    (k8s.io/apimachinery/pkg/labels/selector.go)."""
    words = term.split()
    negated = len(words) > 1 and words[1].startswith("notin")
    return not (term.startswith("!") or "!=" in term or negated)


class LeaderSettings(_Group):
    enabled: bool = Field(
        default=False,
        description="Off for one replica; on (--leader-elect) so only one of several writes.",
    )
    namespace: str = Field(
        default="maas-system", description="Namespace of the Lease: the controller's own."
    )
    lease_name: str = Field(default="weight-controller", description="Name of the Lease.")
    identity: str | None = Field(
        default=None,
        description="This replica's name in the Lease; the hostname (the pod name) if unset.",
    )
    lease_duration: Duration = Field(
        default=15.0,
        le=LEASE_SECONDS_MAX,
        description="How long followers wait after the last renewal before taking over (the "
        "Lease holds it in whole seconds, an int32).",
    )
    renew_deadline: Duration = Field(
        default=RENEW_DEADLINE,
        description="The leader stops writing if it could not renew for this long; shorter "
        "than lease_duration, so it stops before anyone else can start.",
    )
    retry_period: Duration = Field(
        default=RETRY_PERIOD,
        ge=0.1,
        description="How often to renew or try (at least 100ms: at 1ms an attack saw 3,000 "
        "requests to the API server in 7 s).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        return self


class LogSettings(_Group):
    level: Literal["debug", "info", "warning", "error"] = Field(
        default="info",
        description="info: one line per change and the periodic summaries; debug adds every "
        "cluster's status on every tick.",
    )
    format: Literal["auto", "json", "console"] = Field(
        default="auto", description="auto: key=value (logfmt) on a terminal, JSON otherwise."
    )
    summary_interval: DurationOrZero = Field(
        default=300.0,
        description="Every this often, one 'target summary' line per target and one 'cluster "
        "status' line per cluster, so a quiet log still shows the state; 0 turns them off.",
    )
    repeat_interval: Duration = Field(
        default=300.0,
        description="A condition that persists (API down, fail static, a failing pod) is "
        "logged when it starts, at most this often while it lasts, and when it ends.",
    )


# Fields that moved to another group, old place → new: the old spelling is still read (a
# config that worked keeps working), said at start-up and by check-config (``moved``), and
# refused beside the new one.
MOVED = {("scrape", "min_pod_fraction"): ("health", "min_pod_fraction")}


def moved(data: Mapping[str, Any], environ: Mapping[str, str]) -> list[str]:
    """A line for each field ``data`` (a config mapping, as read) or ``environ`` sets at its
    old place."""
    lines = []
    for (group, name), (to, field) in MOVED.items():
        if isinstance(data.get(group), Mapping) and name in data[group]:
            lines.append(
                f"{group}.{name} has moved to {to}.{field}: it is read there; write it there"
            )
        old, new = _env_name(group, name), _env_name(to, field)
        if any(key.upper() == old for key in environ):
            lines.append(f"{old} has moved to {new}: it is read there; set that instead")
    return lines


def _env_name(group: str, name: str) -> str:
    return f"{ENV_PREFIX}{group}__{name}".upper()


def _moved_in(data: dict[str, Any], groups: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with each field of ``MOVED`` at its new place (``groups``: each group's
    model), its value checked under its old name; set at both places to different values
    is a field error (the same value twice is what a config read back looks like)."""
    for (group, name), (to, field) in MOVED.items():
        old = data.get(group)
        if not isinstance(old, Mapping) or name not in old:
            continue
        kept = {k: v for k, v in old.items() if k != name}
        new = data.get(to, {})
        if not isinstance(new, Mapping):  # the group's own validation says what is wrong
            data = {**data, group: kept}
            continue
        info = groups[to].model_fields[field]
        value = _field_value(info, old[name], f"{group}.{name}")
        if field in new and _field_value(info, new[field], None) != value:
            raise ValueError(
                f"{group}.{name} ({value:g}) is set beside {to}.{field} ({new[field]}), where "
                f"it has moved: keep only {to}.{field} (in the file, or as "
                f"{_env_name(to, field)}; the old one may come from {_env_name(group, name)})"
            )
        data = {**data, group: kept, to: {**new, field: value}}
    return data


def _field_value(info: Any, value: Any, where: str | None) -> Any:
    """``value`` validated as the field ``info`` describes; a bad one is a ValueError naming
    ``where`` (``None``: returned as it is, for the group's own validation to name)."""
    try:
        return TypeAdapter(Annotated[info.annotation, info]).validate_python(value)
    except ValidationError as exc:
        if where is None:
            return value
        raise ValueError(f"{where}: {exc.errors()[0]['msg']}") from None


class Settings(BaseSettings):
    """Everything the controller needs, validated once at start-up."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    interval: Duration = Field(
        default=INTERVAL,
        description="Reconcile period: fast enough to follow KV pressure, slow enough that a "
        "weight change shows in the next scrape. 100ms to 1h (under 1s only for tests and "
        "the demo).",
    )

    @field_validator("interval")
    @classmethod
    def _sane_interval(cls, value: float) -> float:
        if not MIN_INTERVAL <= value <= MAX_INTERVAL:
            raise ValueError(
                f"{value:g}s is outside 100ms..1h: a tick must have time to read and write, "
                "and a loop that ticks once a day does not follow load"
            )
        return value

    clusters: list[ClusterSettings] = Field(min_length=1)
    engines: list[EngineSettings] = Field(
        default_factory=list,
        description="Engines of your own beside the built-in rows (controller/engines.py): "
        "read from pages under auto after the built-ins, or named by clusters[].engine; the "
        "default PromQL templates read them too (an info pool rule only with vLLM's labels).",
    )
    queriers: list[Querier] = Field(
        default_factory=list,
        description="Prometheus/Thanos queriers that hold many clusters' series (ACM "
        "observability's hub Thanos): clusters[].prometheus.querier names one.",
    )
    scrape: ScrapeSettings = Field(default_factory=ScrapeSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    weights: WeightSettings = Field(default_factory=WeightSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    prometheus_queries: PrometheusQueries = Field(default_factory=PrometheusQueries)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    leader_election: LeaderSettings = Field(default_factory=LeaderSettings)

    read_environment: ClassVar[bool] = True  # WEIGHT_CONTROLLER_* (GivenSettings: none)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The YAML file arrives as init kwargs; the environment overrides it.
        return (env_settings, init_settings) if cls.read_environment else (init_settings,)

    @model_validator(mode="before")
    @classmethod
    def _derived_defaults(cls, data: Any) -> Any:
        """Defaults that depend on the interval follow it: a config of just ``interval: 1s``
        and clusters works (scrape.timeout defaults to min(3s, interval / 2))."""
        if not isinstance(data, dict):
            return data
        data = _moved_in(data, {n: f.annotation for n, f in cls.model_fields.items()})
        interval = seconds(data.get("interval", INTERVAL))
        scrape = data.get("scrape") or {}
        if interval is not None and isinstance(scrape, dict) and "timeout" not in scrape:
            data = {**data, "scrape": {**scrape, "timeout": min(SCRAPE_TIMEOUT, interval / 2)}}
        # health.max_staleness: at least three intervals, so that a reading held through a
        # failed fetch is never stale on its first (it must be longer than the interval)
        health = data.get("health", {})  # null is the field's own error
        if interval is not None and isinstance(health, dict) and "max_staleness" not in health:
            data = {**data, "health": {**health, "max_staleness": default_staleness(interval)}}
        # The default templates read the config's own engines too (a template given is kept).
        rows = _own_rows(data.get("engines"))
        queries = data.get("prometheus_queries") or {}
        if rows and isinstance(queries, dict):
            defaults = default_templates([*ENGINES.values(), *rows])
            data = {**data, "prometheus_queries": {**defaults, **queries}}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        problems = checks.cross_field_problems(self.model_dump(mode="json"))
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def engine_table(self) -> dict[str, Engine]:
        """The built-in rows, then the config's own, in the order ``auto`` tries them."""
        return {**ENGINES, **{e.name: e.row() for e in self.engines}}

    def cluster_timeout(self, cluster: ClusterSettings) -> float:
        return cluster.timeout if cluster.timeout is not None else self.scrape.timeout

    @property
    def settle(self) -> float:
        """``weights.settle`` in seconds; unset, two intervals."""
        settle = self.weights.settle
        return 2 * self.interval if settle is None else float(settle)


def _own_rows(raw: object) -> list[Engine]:
    """The config's own engines as rows, from raw data: those that are valid (an invalid one
    is reported by its own field's validation)."""
    rows = []
    for item in raw if isinstance(raw, list) else ():
        try:
            rows.append(EngineSettings.model_validate(item).row())
        except ValueError:
            continue
    return rows


class GivenSettings(Settings):
    """Settings from the mapping alone, no ``WEIGHT_CONTROLLER_*`` variable read: what the
    demo and the simulator build their own clusters with, so a shell that holds one for a
    daemon does not change their story."""

    read_environment = False
