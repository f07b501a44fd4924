"""Pure: PromQL answers → a cluster's ``ClusterMetrics``. One conversion for the live source
(``prometheus``: each query's instant answer now) and for replay (a range query's answer at
one of its steps, which Prometheus evaluates exactly as an instant query at that time).

A query's answer is its series, ``(labels, value)``; ``split`` turns them into one number per
cluster (by the querier's cluster label, ``""`` when not grouped); ``cluster_metrics`` reads
one cluster's numbers as the source's fetch would: an empty result is unknown, never 0, a
failed query fails only what it feeds, and values no cluster can have are refused by name.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from controller.errors import FetchError
from controller.model import CapacityFrom, ClusterMetrics, Latency, PodError, Reason
from controller.sources import (
    MAX_IN_FLIGHT,
    MAX_KV_TOKENS_PER_POD,
    MAX_LATENCY,
    MAX_PODS,
    kv_tokens_problem,
    pod_count_problem,
)

REQUIRED = ("kv_mean",)  # without it a cluster cannot be weighed
_REQUIRED = frozenset(REQUIRED)
NAMES = (
    "kv_mean",
    "kv_max",
    "kv_valid_pods",
    "kv_oldest",
    "pods",
    "kv_pools",
    "kv_tokens",
    "queue",
    "running",
    "latency_requests",
)
# Not queries: the pods kv_pools and kv_tokens found a pool on.
POOL_PODS = "kv_pool_pods"
TOKEN_PODS = "kv_token_pods"
POOL_SERIES = "kv_pool_series"  # kv_pools' series by cluster: one at its cap was cut
NOT_QUERIES = (POOL_PODS, TOKEN_PODS, POOL_SERIES)
Series = Sequence[tuple[Mapping[str, str], float]]  # one query's answer: (labels, value)
Answers = dict[str, dict[str, float] | FetchError]  # query → {cluster label value: value}


def vectors(series: Series, label: str, finite: bool = True) -> dict[str, float]:
    """An answer by the value of ``label`` (``""`` when it is not grouped); NaN and
    infinities are unknown, so left out (``finite=False``: kept, for a check that names
    them)."""
    found: dict[str, float] = {}
    for metric, value in series:
        key = str(metric.get(label, "")) if label else ""
        if not finite or math.isfinite(value):
            found.setdefault(key, value)
    return found


_POOL_LABELS = frozenset(("num_gpu_blocks", "block_size"))


Pool = tuple[str, float | None, tuple[tuple[str, str], ...]]  # ``pool_of``


def pool_of(metric: Mapping[str, str], label: str) -> Pool:
    """What a ``kv_pools`` series says whatever its value: its cluster (the value of
    ``label``), the tokens one engine of its pool holds (``None`` where its pool labels are
    not whole numbers > 0) and its pod (or a Ray node's replica): every label but the pool's."""
    key = str(metric.get(label, "")) if label else ""
    try:
        blocks, size = int(metric["num_gpu_blocks"]), int(metric["block_size"])
        each = float(blocks) * size  # past a float's range: infinite, refused as no pool is
    except (KeyError, ValueError, OverflowError):
        return key, None, ()
    if blocks <= 0 or size <= 0:
        return key, None, ()
    pod = tuple(sorted((k, str(v)) for k, v in metric.items() if k not in _POOL_LABELS))
    return key, each, pod


def counted(keys: Iterable[str]) -> dict[str, float]:
    """How many series an answer holds by cluster, from each series' cluster (the value of
    its label): for live answers and each time of a range answer alike."""
    return {key: float(n) for key, n in Counter(keys).items()}


def pools(series: Series, label: str) -> tuple[dict[str, float], dict[str, float]]:
    """The ``kv_pools`` answer (engines by pod and KV pool) as KV tokens and pods with a
    pool, by the value of ``label``; a series whose pool labels are not whole numbers > 0
    leaves its cluster out (unknown, never a guess)."""
    return pooled([(pool_of(metric, label), engines) for metric, engines in series])


def pooled(
    series: Sequence[tuple[Pool, float]],
) -> tuple[dict[str, float], dict[str, float]]:
    """``pools`` from each series' ``pool_of`` (worked out once a series, where a range
    answer gives it at many times) and its value, the engines on that pool."""
    tokens: dict[str, float] = {}
    pods: dict[str, set[tuple[tuple[str, str], ...]]] = {}
    broken: set[str] = set()
    for (key, each, pod), engines in series:
        if each is None or not math.isfinite(engines) or engines <= 0:
            broken.add(key)
            continue
        tokens[key] = tokens.get(key, 0.0) + engines * each
        pods.setdefault(key, set()).add(pod)
    return (
        {k: v for k, v in tokens.items() if k not in broken},
        {k: float(len(v)) for k, v in pods.items() if k not in broken},
    )


def pod_tokens(series: Series, label: str) -> tuple[dict[str, float], dict[str, float]]:
    """The ``kv_tokens`` answer (tokens by pod) as KV tokens and pods with a pool, by the
    value of ``label``; a pod whose pool is not a positive number leaves its cluster out."""
    tokens: dict[str, float] = {}
    pods: dict[str, float] = {}
    broken: set[str] = set()
    for metric, value in series:
        key = str(metric.get(label, "")) if label else ""
        if not math.isfinite(value) or value <= 0:
            broken.add(key)
            continue
        tokens[key] = tokens.get(key, 0.0) + value
        pods[key] = pods.get(key, 0.0) + 1
    return (
        {k: v for k, v in tokens.items() if k not in broken},
        {k: v for k, v in pods.items() if k not in broken},
    )


def split(name: str, series: Series, label: str) -> Answers:
    """One query's answer by cluster (with the pods a pool was found on, for the pool
    queries)."""
    if name == "kv_pools":
        tokens, pods = pools(series, label)
        keys = (str(metric.get(label, "")) if label else "" for metric, _ in series)
        return {name: tokens, POOL_PODS: pods, POOL_SERIES: counted(keys)}
    if name == "kv_tokens":
        tokens, pods = pod_tokens(series, label)
        return {name: tokens, TOKEN_PODS: pods}
    # a pod count NaN or infinite is refused by name (``_checked``)
    return {name: vectors(series, label, finite=name != "pods")}


@dataclass(frozen=True, slots=True)
class Asked:
    """Whom the answers were asked of, for one cluster: the querier's address (named in
    errors), its cluster label and this cluster's value of it, the queries as sent (an empty
    one is named with its text), its rate window in seconds, and the fewest requests a
    latency is computed over; and how many pool series each cluster may answer
    (``Querier.per_cluster``: a cluster at it was cut)."""

    base: str
    label: str | None
    value: str
    queries: Mapping[str, str]
    window: float
    min_requests: float
    per_cluster: int | None = None


def cluster_metrics(
    name: str,
    answers: Answers,
    asked: Asked,
    started: float,
    duration: float,
    since: float | None,
) -> ClusterMetrics:
    """Cluster ``name``'s metrics from its querier's ``answers`` at ``started``; ``since``:
    when its previous answers were read (``None``: never), for the requests completed
    between them."""
    values: dict[str, float | None] = {}
    errors: list[PodError] = []
    mine = asked.value
    for query, answer in answers.items():
        if isinstance(answer, dict):
            values[query] = answer.get(mine)
            continue
        url = f"{asked.base} ({query})"
        # a querier that refuses is down, which says nothing of the cluster
        reason = Reason.CONNECT if answer.reason is Reason.REFUSED else answer.reason
        errors.append(PodError(url, reason, answer.detail))
    pages = len(answers) - sum(key in answers for key in NOT_QUERIES)
    if not values.keys() >= _REQUIRED:
        failed = tuple(errors[:1])
        return ClusterMetrics(name, started, duration, 1, 0, errors=failed, pages=pages)
    values, refused = _checked(values, asked)
    invalid = _invalid(values, asked)
    if invalid is not None:
        refused.append(invalid)
    elif values.get("kv_mean") is None:
        refused.append(_empty("kv_mean", asked))
    completed = _completed(values, asked, since, started)
    return _metrics(name, values, asked, started, duration, (*errors, *refused), pages, completed)


def _completed(
    values: Mapping[str, float | None], asked: Asked, since: float | None, now: float
) -> float | None:
    """Requests completed since the previous answers, from the rate window's increase: the
    window's count scaled to the time since then (answers a tick apart share most of a
    window). Unknown the first time."""
    requests = values.get("latency_requests")
    if requests is None or since is None:
        return None
    window = asked.window or 60.0
    return requests * min(max(0.0, now - since), window) / window


def _empty(query: str, asked: Asked) -> PodError:
    """The query that answered nothing for this cluster, named with its start, so an
    operator can run it: a cluster the querier holds no such series for (its label value,
    its engine's names, the matchers)."""
    who = f"{asked.label}={asked.value!r}" if asked.label else "this querier"
    text = asked.queries[query]
    shown = text if len(text) <= 300 else text[:299] + "…"
    detail = f"{query} came back empty for {who}: no KV-cache series of any engine; {shown}"
    return PodError(f"{asked.base} ({query})", Reason.MISSING_METRIC, detail)


def invalid_pods(values: Mapping[str, float | None]) -> int:
    """The pods reporting KV (``pods``) without a fraction 0..1 among their samples
    (``kv_valid_pods``, read when it answered: none for the cluster is none valid); 0 where
    either is unknown or the counts say nothing (more valid pods than pods)."""
    pods = values.get("pods")
    if pods is None or "kv_valid_pods" not in values:
        return 0
    valid = values["kv_valid_pods"] or 0.0
    return int(pods - valid) if 0 <= valid < pods else 0


def _invalid(values: Mapping[str, float | None], asked: Asked) -> PodError | None:
    """The pods whose KV-cache use is no fraction 0..1, named: left out of the mean as a
    page read directly leaves such a pod out (``out_of_range``)."""
    count = invalid_pods(values)
    if count < 1:
        return None
    detail = (
        f"{count} of {values.get('pods'):g} pods' KV-cache use is no fraction 0..1 (NaN, "
        "below 0 or above 1: a percentage?), left out of kv_mean and kv_max"
    )
    return PodError(f"{asked.base} (kv_valid_pods)", Reason.OUT_OF_RANGE, detail)


def _checked(
    values: dict[str, float | None], asked: Asked
) -> tuple[dict[str, float | None], list[PodError]]:
    """Pod counts and KV-pool sizes no cluster can have (NaN, negative, 1e12), queues or
    running counts past ``MAX_IN_FLIGHT`` and latencies below 0 or past a day are refused by
    name and read as unknown, never as capacity or load. (A number plainly in range is not asked
    about: this runs for every cluster every tick.)"""
    refused = []
    pods = values.get("pods")
    if pods is not None and not 0 <= pods <= MAX_PODS and (why := pod_count_problem(pods, "pods")):
        refused.append(PodError(f"{asked.base} (pods)", Reason.OUT_OF_RANGE, why))
        values = {**values, "pods": None}
    for query in ("queue", "running"):  # below 0 is none (``_count``); 1e300 is no count
        count = values.get(query)
        if count is not None and not count <= MAX_IN_FLIGHT and count >= 0:
            why = f"{query}={count:g}: more requests than a cluster holds ({MAX_IN_FLIGHT:,.0f})"
            refused.append(PodError(f"{asked.base} ({query})", Reason.OUT_OF_RANGE, why))
            values = {**values, query: None}
    for query in ("p50", "p90"):  # a NaN (no requests) is unknown (``_latency``)
        seconds = values.get(query)
        if seconds is not None and seconds == seconds and not 0 <= seconds <= MAX_LATENCY:
            past = "below 0" if seconds < 0 else "past a day"
            why = f"{query}={seconds:g}: a latency {past}"
            refused.append(PodError(f"{asked.base} ({query})", Reason.OUT_OF_RANGE, why))
            values = {**values, query: None}
    for query, pods_key in (("kv_pools", POOL_PODS), ("kv_tokens", TOKEN_PODS)):
        cut = asked.per_cluster
        answered = values.get(POOL_SERIES if query == "kv_pools" else pods_key) or 0.0
        if cut is not None and answered >= cut:
            why = (
                f"{query}: {cut} pool series or more, this cluster's share of "
                "scrape.max_page_samples among its querier's: cut, so its pool is unknown"
            )
            refused.append(PodError(f"{asked.base} ({query})", Reason.TOO_MANY_SAMPLES, why))
            values = {**values, query: None, pods_key: None}
            continue
        tokens = values.get(query)
        if tokens is None or 0 < tokens <= MAX_KV_TOKENS_PER_POD:  # within any pod's cache
            continue
        pool_pods = values.get(pods_key) or 0.0
        if why := kv_tokens_problem(tokens, pool_pods, query):
            refused.append(PodError(f"{asked.base} ({query})", Reason.OUT_OF_RANGE, why))
            values = {**values, query: None, pods_key: None}
    return values, refused


def _metrics(
    name: str,
    v: Mapping[str, float | None],
    asked: Asked,
    started: float,
    duration: float,
    errors: tuple[PodError, ...],
    pages: int,
    completed: float | None,
) -> ClusterMetrics:
    pods = int(v.get("pods") or 0)
    invalid = invalid_pods(v)  # pods reporting KV, of them unusable (``_invalid``)
    kv = v.get("kv_mean")
    if kv is not None and not 0.0 <= kv <= 1.0:
        kv = None  # an out-of-range fraction is unusable, as in a direct scrape
    queue, running = _count(v.get("queue")), _count(v.get("running"))
    # every pod reporting KV says what it holds (by vLLM's labels or another engine's
    # gauges), or the capacity stays in pods
    pooled = (v.get(POOL_PODS) or 0) + (v.get(TOKEN_PODS) or 0)
    sizes = [t for t in (v.get("kv_pools"), v.get("kv_tokens")) if t is not None]
    tokens = sum(sizes) if sizes and pooled >= max(1, pods) else None
    return ClusterMetrics(
        cluster=name,
        scraped_at=started,
        duration=duration,
        pods_scraped=max(1, pods),
        # a pod whose KV is unusable answers as a page with one does (the cluster degraded);
        # every pod's: none does, and the cluster fails by that reason
        pods_answering=0 if kv is None and 0 < pods <= invalid else max(1, pods - invalid),
        kv_mean=kv,
        kv_max=v.get("kv_max") if kv is not None else None,
        kv_family="promql" if kv is not None else None,
        queue_depth=queue,
        queue_per_pod=queue / pods if queue is not None and pods else None,
        running=running,
        latency=_latency(v, asked.min_requests),
        observed_at=v.get("kv_oldest"),
        observed_newest=_ahead(v.get("kv_oldest"), started),
        invalid_samples=invalid,
        errors=errors,
        kv_tokens=tokens,
        kv_tokens_from=CapacityFrom.KV_BLOCKS if tokens is not None else None,
        pages=pages,
        completed=completed,
    )


# A querier stamps samples by its own clock (or its spokes'), which may run a few seconds
# ahead of ours; no clock is this far off.
QUERIER_AHEAD = 60.0


def _ahead(oldest: float | None, now: float) -> float | None:
    """The oldest pod's newest sample where it is stamped more than ``QUERIER_AHEAD`` past
    our clock: every pod's is then, and it is judged as a page's from the future (stale),
    where an answer a day ahead switched staleness off (found by an attack). A skew of a
    few seconds between two clocks is not (the page path's 5 s would make it unhealthy)."""
    return oldest if oldest is not None and oldest > now + QUERIER_AHEAD else None


def _count(value: float | None) -> float | None:
    """A count of requests as answered: below 0 (or NaN) it counts nothing, unknown."""
    return value if value is not None and value >= 0 else None


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _latency(v: Mapping[str, float | None], min_requests: float) -> Latency | None:
    requests = v.get("latency_requests")
    if requests is None:
        return None
    if requests < min_requests:
        return Latency(None, None, None, requests=requests, family="promql")
    p50, p90 = (_finite(v.get(q)) for q in ("p50", "p90"))
    return Latency(p50, p90, None, requests=requests, family="promql")
