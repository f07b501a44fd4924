"""Frozen data that flows one way: sources → health → weights → publishers and exporter."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Reason(StrEnum):
    """Why a page, or a whole cluster, is not usable. Values appear in logs and metric labels."""

    TIMEOUT = "timeout"
    CONNECT = "connect"
    HTTP_STATUS = "http_status"
    PARSE = "parse"
    TOO_LARGE = "too_large"
    MISSING_METRIC = "missing_metric"
    STALE = "stale"
    NO_PODS = "no_pods"
    INTERNAL = "internal"


@dataclass(frozen=True, slots=True)
class PodError:
    """One endpoint of a cluster that did not give us usable data this tick."""

    url: str
    reason: Reason
    detail: str


@dataclass(frozen=True, slots=True)
class Latency:
    """Request latency over the window between two scrapes (never since process start)."""

    p50: float | None
    p90: float | None
    mean: float | None
    requests: float
    family: str


@dataclass(frozen=True, slots=True)
class ClusterMetrics:
    """What one fetch learned about one cluster. ``None`` always means unknown, never zero."""

    cluster: str
    scraped_at: float
    duration: float
    pods_scraped: int
    pods_answering: int
    kv_mean: float | None = None
    kv_max: float | None = None
    kv_family: str | None = None
    queue_depth: float | None = None
    queue_per_pod: float | None = None
    running: float | None = None
    latency: Latency | None = None
    observed_at: float | None = None
    invalid_samples: int = 0
    errors: tuple[PodError, ...] = ()

    @classmethod
    def failed(cls, cluster: str, now: float, reason: Reason, detail: str) -> ClusterMetrics:
        """A fetch that produced nothing at all (e.g. the tick deadline passed)."""
        return cls(
            cluster=cluster,
            scraped_at=now,
            duration=0.0,
            pods_scraped=0,
            pods_answering=0,
            errors=(PodError(url="*", reason=reason, detail=detail),),
        )


@dataclass(frozen=True, slots=True)
class Signals:
    """The inputs the weights function uses for one healthy cluster."""

    kv: float
    queue_per_pod: float | None = None
    latency: float | None = None


@dataclass(frozen=True, slots=True)
class ClusterHealth:
    """Health of one cluster after a tick; ``signals`` is what weighting may use."""

    healthy: bool
    reason: Reason | None
    failures: int
    successes: int
    degraded: bool
    changed: bool
    signals: ClusterMetrics | None = None


class Mode(StrEnum):
    """How the weights of a tick were decided; logged and exported."""

    INITIAL = "initial"
    NORMAL = "normal"
    HOLD = "hold"
    SATURATED = "saturated"
    FAIL_STATIC = "fail_static"
    NO_DATA = "no_data"


@dataclass(frozen=True, slots=True)
class Decision:
    """The weights after a tick. ``weights`` is ``None`` only before any cluster was ever usable."""

    weights: Mapping[str, int] | None
    targets: Mapping[str, float]
    mode: Mode
    changed: bool
    notes: tuple[str, ...] = field(default=())
