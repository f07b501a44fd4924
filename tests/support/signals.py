"""Clusters as the laws see them, made the way the daemon makes them: fetches judged by
``controller.health`` and derived by ``controller.signals``, so the laws are tested on the
inputs the daemon produces, not on a formula of the test's own."""

from __future__ import annotations

from controller import health, signals
from controller.model import ClusterHealth, ClusterMetrics, Signals
from controller.settings import HealthSettings, WeightSettings

INTERVAL = 10.0
RUNNING_PER_POD = 4.0


def fetch(
    kv: float | None, pods: int = 2, queue: float = 0.0, at: float = 0.0, name: str = "c"
) -> ClusterMetrics:
    """One fetch of ``pods`` pods at ``kv``, each running ``RUNNING_PER_POD`` requests with
    ``queue`` more waiting."""
    return ClusterMetrics(
        name,
        scraped_at=at,
        duration=0.0,
        pods_scraped=pods,
        pods_answering=pods,
        kv_mean=kv,
        kv_max=kv,
        queue_depth=queue * pods,
        queue_per_pod=queue,
        running=RUNNING_PER_POD * pods,
    )


def history(
    kvs: list[float | None], pods: int = 2, queue: float = 0.0, params: WeightSettings | None = None
) -> tuple[ClusterHealth, signals.SignalMemory]:
    """Health and signal memory after fetches at ``kvs``, oldest first, an interval apart
    (``None``: a fetch with no KV reading, which health judges a failure)."""
    params = params or WeightSettings()
    state: ClusterHealth | None = None
    memory: signals.SignalMemory | None = None
    for index, kv in enumerate(kvs):
        at = INTERVAL * index
        metrics = fetch(kv, pods, queue, at)
        state = health.judge(state, metrics, HealthSettings(), at)
        memory = signals.remember(memory, metrics, state, params.demand_smoothing)
    assert state is not None and memory is not None
    return state, memory


def read(
    *kvs: float, pods: int = 2, queue: float = 0.0, params: WeightSettings | None = None
) -> Signals:
    """The Signals the daemon derives after fetches at ``kvs`` (the last is now)."""
    params = params or WeightSettings()
    state, memory = history(list(kvs), pods, queue, params)
    derived = signals.derive(state, memory, params)
    assert derived is not None
    return derived
