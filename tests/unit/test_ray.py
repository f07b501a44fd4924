"""Ray Serve LLM: a Ray node's page holds replicas of several models; each replica of the
cluster's model is read as a pod, keyed by its ``ReplicaId`` whatever node page it is on."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from controller.engines import ENGINES
from controller.exposition import Extractor, Sample
from controller.model import CapacityFrom, ClusterMetrics, PodError, Reason
from controller.settings import build_settings
from controller.signals import capacity_from, pods
from controller.sources.between import NODE_WINDOW, QUIET_READS, REPLICA_READS
from controller.sources.page import (
    POD_EXTRACTOR,
    POD_GAUGES,
    POD_HISTOGRAMS,
    Page,
    read_page,
    replicas_on,
)
from controller.sources.reader import PageReader
from tests.support.engines import Load, Replica, ray_node_page

A, B = "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct"
OLD, NEW = "aa" * 28, "bb" * 28


def reader(model: str | None, nodes: int = 1, per_pod: int | None = None) -> PageReader:
    cluster = {
        "name": "c",
        "vllm_urls": [f"http://10.0.0.{i}:8080/metrics" for i in range(nodes)],
        "model_name": model,
        "kv_tokens_per_pod": per_pod,
    }
    settings = build_settings({"clusters": [cluster]})
    return PageReader(settings.clusters[0], min_latency_requests=1)


def node(replicas: list[Replica], index: int = 0) -> Page:
    page = read_page(
        f"http://10.0.0.{index}:8080/metrics",
        ray_node_page(replicas, f"10.0.0.{index}"),
        POD_EXTRACTOR,
    )
    assert isinstance(page, Page), page
    return page


def read(r: PageReader, pages: list[Page], at: float = 0.0) -> ClusterMetrics:
    return r.read(pages, None, at, 0.0)


TWO_MODELS = [
    Replica(A, Load(kv=0.95, waiting=8, running=4, blocks=20_000), "a-1", "01" * 28),
    Replica(A, Load(kv=0.85, waiting=4, running=2, blocks=30_000), "a-2", "02" * 28),
    Replica(B, Load(kv=0.20, waiting=0, running=1, blocks=50_000), "b-1", "03" * 28),
]


def test_one_node_of_two_models_is_read_as_two_clusters_by_model_name() -> None:
    a = read(reader(A), [node(TWO_MODELS)])
    b = read(reader(B), [node(TWO_MODELS)])
    assert a.errors == () and b.errors == ()
    assert (a.engine, a.replicas, a.pods_answering, a.pods_scraped) == ("ray-vllm", 2, 1, 1)
    assert a.kv_mean == pytest.approx(0.90) and a.kv_max == 0.95
    assert (a.queue_depth, a.running, a.queue_per_pod) == (12.0, 6.0, 6.0)
    assert (a.kv_tokens, a.kv_tokens_from) == ((20_000 + 30_000) * 16, CapacityFrom.KV_BLOCKS)
    assert (b.replicas, b.kv_mean, b.queue_depth, b.kv_tokens) == (1, 0.2, 0.0, 50_000 * 16)
    assert (pods(a), pods(b)) == (2.0, 1.0)  # replicas, not the one node


def test_a_model_s_replicas_are_counted_over_every_node_page() -> None:
    first, second = TWO_MODELS[:1], [*TWO_MODELS[1:], Replica(A, Load(kv=0.5), "a-3", "04" * 28)]
    metrics = read(reader(A, nodes=2), [node(first, 0), node(second, 1)])
    assert (metrics.replicas, metrics.pods_answering) == (3, 2)
    assert metrics.kv_mean == pytest.approx((0.95 + 0.85 + 0.5) / 3)


def test_a_node_without_the_model_answers_and_the_cluster_is_not_degraded() -> None:
    metrics = read(reader(B, nodes=2), [node(TWO_MODELS[:2], 0), node(TWO_MODELS[2:], 1)])
    assert (metrics.replicas, metrics.pods_answering, metrics.pods_scraped) == (1, 2, 2)
    assert metrics.errors == ()


def test_no_replica_of_the_model_is_a_missing_metric_naming_the_model() -> None:
    metrics = read(reader("mistral"), [node(TWO_MODELS)])
    assert [e.reason for e in metrics.errors] == [Reason.MISSING_METRIC]
    assert "mistral" in metrics.errors[0].detail and metrics.replicas == 0


def test_a_pool_is_kept_after_ray_drops_its_info_gauge_and_said_so() -> None:
    r = reader(A)
    seen = read(r, [node(TWO_MODELS)])
    gone = [Replica(x.model, x.load, x.replica, x.worker, info=False) for x in TWO_MODELS]
    later = read(r, [node(gone)], 10.0)
    assert later.kv_tokens == seen.kv_tokens == 50_000 * 16
    assert later.kv_tokens_from == CapacityFrom.KV_BLOCKS_KEPT


def test_a_replica_never_seen_with_its_pool_counts_by_the_configured_size_or_replicas() -> None:
    gone = [Replica(x.model, x.load, x.replica, x.worker, info=False) for x in TWO_MODELS]
    sized = read(reader(A, per_pod=100_000), [node(gone)])
    assert (sized.kv_tokens, sized.kv_tokens_from) == (200_000, CapacityFrom.KV_TOKENS_PER_POD)
    plain = read(reader(A), [node(gone)])
    assert plain.kv_tokens is None and capacity_from(plain) == CapacityFrom.REPLICAS
    assert pods(plain) == 2.0


def test_a_restarted_replica_is_one_replica_and_not_a_load_balanced_url() -> None:
    """A replica restarted under a new worker keeps its ReplicaId; the old worker's series
    stay on the page until Ray drops them. The count is not doubled, the new worker's values
    are read, and its counts starting over are not another process behind the URL."""
    r = reader(A)
    before = Replica(A, Load(kv=0.9, waiting=6, completed=5000), "a-1", OLD)
    assert read(r, [node([before])]).replicas == 1
    reasons = []
    for tick in range(1, 6):
        after = Replica(A, Load(kv=0.3, waiting=1, completed=10 * tick), "a-1", NEW)
        lingering = [before, after] if tick < 4 else [after]
        metrics = read(r, [node(lingering)], 10.0 * tick)
        reasons += [e.reason for e in metrics.errors]
        assert (metrics.replicas, metrics.kv_mean, metrics.queue_depth) == (1, 0.3, 1.0)
    assert Reason.LOAD_BALANCED not in reasons and reasons == []


def test_latency_comes_from_each_replica_s_own_histogram() -> None:
    r = reader(A)
    replicas = [Replica(A, Load(kv=0.5, completed=100), "a-1"), Replica(B, Load(kv=0.5), "b-1")]
    assert read(r, [node(replicas)]).latency is None  # a baseline
    replicas[0] = Replica(A, Load(kv=0.5, completed=160), "a-1")
    then = read(r, [node(replicas)], 10.0)
    assert then.latency is not None and then.latency.requests == 60
    assert then.latency.family == "ray_vllm_e2e_request_latency_seconds"


def test_forgetting_a_node_forgets_its_replicas_but_not_another_s() -> None:
    """Discovery drops node 0: its replica's latency baseline goes, node 1's stays."""
    r = reader(A, nodes=2)

    def both(completed: int, at: float) -> ClusterMetrics:
        load = Load(kv=0.5, completed=completed)
        nodes = [node([Replica(A, load, "a-1", "01" * 28)], 0)]
        nodes.append(node([Replica(A, load, "a-2", "02" * 28)], 1))
        return read(r, nodes, at)

    both(100, 0.0)
    r.retain(["http://10.0.0.1:8080/metrics"])
    then = both(160, 10.0)
    assert then.latency is not None and then.latency.requests == 60  # a-2's increase alone


CAPTURE = Path(__file__).parents[1] / "fixtures" / "ray-2.60-node-two-models.prom"


@pytest.mark.parametrize(
    ("model", "expected"),
    [(A, (2, 0.90, 12.0, 6.0, (20_000 + 30_000) * 16)), (B, (1, 0.20, 0.0, 1.0, 50_000 * 16))],
)
def test_a_page_captured_from_a_real_ray_node_reads_each_model_exactly(
    model: str, expected: tuple[float, ...]
) -> None:
    page = read_page("http://10.0.0.0:8080/metrics", CAPTURE.read_text(), POD_EXTRACTOR)
    assert isinstance(page, Page), page
    metrics = read(reader(model), [page])
    assert metrics.errors == () and metrics.engine == "ray-vllm"
    got = (*by_model(metrics), metrics.kv_tokens)
    assert got == pytest.approx(expected)


def by_model(metrics: ClusterMetrics) -> tuple[float | None, ...]:
    replicas = float(metrics.replicas) if metrics.replicas is not None else None
    return (replicas, metrics.kv_mean, metrics.queue_depth, metrics.running)


# ---- what a stranger's review of #42 found ---------------------------------------------------


def test_an_idle_replica_whose_gauges_ray_dropped_is_read_as_idle() -> None:
    """vLLM sets its gauges as its engine steps; an idle replica's are dropped by Ray while
    its histogram stays. It is still a replica, and it holds nothing: not stepping, nothing
    runs or waits there (until 2026-12-07 it was read as last seen, which left a crashed
    worker's load on the page for good). A fully idle cluster is healthy, not missing."""
    r = reader(A)
    read(r, [node(TWO_MODELS)])
    idle = [
        Replica(x.model, x.load, x.replica, x.worker, info=False, gauges=False) for x in TWO_MODELS
    ]
    metrics = read(r, [node(idle)], 10.0)
    assert metrics.errors == ()
    assert by_model(metrics) == (2.0, 0.0, 0.0, 0.0)
    assert metrics.kv_tokens == (20_000 + 30_000) * 16


def test_a_node_without_vllm_series_holds_no_replica_under_auto() -> None:
    """A KubeRay head node's page has Ray's own series only: an answering node, never a pod
    of unknown engine that would take the cluster's capacity away."""
    metrics = read(reader(A, nodes=2), [node([], 0), node(TWO_MODELS, 1)])
    assert (metrics.replicas, metrics.pods_answering, metrics.errors) == (2, 2, ())
    assert metrics.kv_tokens_from == CapacityFrom.KV_BLOCKS


def test_a_node_whose_replicas_are_all_refused_does_not_answer() -> None:
    bad = Replica(A, Load(kv=42.0), "a-9", "09" * 28)
    one = read(reader(A, nodes=2), [node([bad, *TWO_MODELS[:1]], 0), node(TWO_MODELS[1:2], 1)])
    assert (one.replicas, one.pods_answering) == (2, 2)
    assert [e.reason for e in one.errors] == [Reason.OUT_OF_RANGE]
    every = read(reader(A, nodes=2), [node([bad], 0), node(TWO_MODELS[1:2], 1)])
    assert (every.replicas, every.pods_answering, every.pods_scraped) == (1, 1, 2)


def test_one_replica_shown_by_two_nodes_is_one_replica() -> None:
    r = reader(A, nodes=2)
    read(r, [node([Replica(A, Load(kv=0.9), "a-1", OLD)], 0), node([], 1)])
    moved = [node([Replica(A, Load(kv=0.9), "a-1", OLD)], 0)]
    moved.append(node([Replica(A, Load(kv=0.3), "a-1", NEW)], 1))
    metrics = read(r, moved, 10.0)
    assert (metrics.replicas, metrics.kv_mean) == (1, 0.3)


def test_a_node_that_misses_a_scrape_keeps_its_replicas_baselines() -> None:
    """Discovery keeps both nodes; node 1 fails one scrape: its replica's latency baseline
    is kept, so the next read counts its requests since the last it saw."""
    r = reader(A, nodes=2)
    urls = [f"http://10.0.0.{i}:8080/metrics" for i in range(2)]

    def tick(completed: int, at: float, down: bool = False) -> ClusterMetrics:
        r.retain(urls)
        load = Load(kv=0.5, completed=completed)
        second = PodError(urls[1], Reason.TIMEOUT, "no answer")
        pages: list[Page | PodError] = [node([Replica(A, load, "a-1", "01" * 28)], 0)]
        pages.append(second if down else node([Replica(A, load, "a-2", "02" * 28)], 1))
        return r.read(pages, None, at, 0.0)

    tick(100, 0.0)
    tick(150, 10.0, down=True)
    then = tick(200, 20.0)
    assert then.latency is not None and then.latency.requests == 50 + 100  # a-1's, a-2's


def test_a_replica_unread_for_long_is_forgotten() -> None:
    """Listed nodes are never retained away: a replica not read for REPLICA_READS reads is
    forgotten (its latency baseline with it), so replicas that come and go cannot grow
    what is kept without end."""
    r = reader(A)
    first = [Replica(A, Load(kv=0.5, completed=100), "a-1", "01" * 28)]
    other = [Replica(A, Load(kv=0.5), "a-2", "02" * 28)]
    read(r, [node(first)])
    for tick in range(1, REPLICA_READS + 2):
        read(r, [node(other)], 10.0 * tick)
    back = [Replica(A, Load(kv=0.5, completed=160), "a-1", "01" * 28), *other]
    metrics = read(r, [node(back)], 1000.0)
    assert metrics.latency is None or metrics.latency.requests == 0  # a-1: a baseline again


def test_a_cluster_naming_no_model_on_a_node_of_two_is_told_so() -> None:
    mixed = read(reader(None), [node(TWO_MODELS)])
    assert [n.reason for n in mixed.notices] == [Reason.MIXED_MODELS]
    assert A in mixed.notices[0].detail and B in mixed.notices[0].detail
    assert read(reader(A), [node(TWO_MODELS)]).notices == ()


def test_a_node_page_is_split_by_replica_and_process_whatever_order_its_lines_come_in() -> None:
    """``replicas_on`` groups by runs of one replica; shuffled lines (one replica's buckets
    between another's, a restarted replica's two processes interleaved) are grouped as a
    plain dictionary would group them, each name's samples in page order."""
    restarted = [
        *TWO_MODELS,
        Replica(A, Load(kv=0.5, waiting=0, running=1, blocks=20_000), "a-1", OLD),
        Replica(A, Load(kv=0.6, waiting=1, running=2, blocks=20_000), "a-1", NEW),
    ]
    engine = ENGINES["ray-vllm"]
    label, process, model = engine.replica_label, engine.process_label, engine.model_label
    assert label is not None and process is not None
    rng = random.Random("split")
    for _ in range(20):
        whole = node(restarted)
        shuffled = {
            name: rng.sample(samples, len(samples)) for name, samples in whole.samples.items()
        }
        page = replace(whole, samples=shuffled, split={})
        expected: dict[str, dict[str, dict[str, list[Sample]]]] = {}
        names: dict[tuple[str, str], set[str]] = {}
        for name, samples in shuffled.items():
            for s in samples:
                if label not in s.labels:
                    continue
                replica, worker = s.labels[label], s.labels.get(process, "")
                group = expected.setdefault(replica, {}).setdefault(worker, {})
                group.setdefault(name, []).append(s)
                names.setdefault((replica, worker), set()).add(s.labels.get(model, ""))
        split = replicas_on(page, engine)
        assert {r: {w: dict(u) for w, (u, _) in ws.items()} for r, ws in split.items()} == expected
        assert {(r, w): set(m) for r, ws in split.items() for w, (_, m) in ws.items()} == names
        assert len(expected) == 3 and len(expected["a-1"]) == 3  # its three processes


def test_a_fleet_whose_lines_outnumber_the_label_cache_is_read_from_it_once_grown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each Ray node's page names its node, workers and replicas, so no two nodes share a
    wanted line: a fleet's lines outnumbered the cache, each was dropped before its node
    came round again, and every tick parsed them all anew (200 nodes: 16 ms a node page, 1
    for the floor). Read tick after tick (here with a cache 64 times smaller, so twelve
    nodes outnumber it eight times), the cache grows until a tick is read from it alone:
    the same samples as the first, each from the label set the tick before was given."""
    from controller import exposition

    monkeypatch.setattr(exposition, "_CACHE_LIMIT", 256)
    monkeypatch.setattr(exposition, "_CACHE_BYTES", 64 * 1024)
    monkeypatch.setattr(exposition._Idents, "LIMIT", 256)
    monkeypatch.setattr(exposition, "_IDENTS", exposition._Idents())
    extractor = Extractor(gauges=POD_GAUGES, histograms=POD_HISTOGRAMS)
    rng = random.Random(7)

    def replica(n: int, i: int) -> Replica:
        load = Load(kv=rng.random(), waiting=rng.randint(0, 9), running=2, blocks=20_000)
        return Replica(A if i % 2 else B, load, f"n{n}-r{i}", f"{n:02d}{i:02d}" * 14)

    pages = {
        f"http://10.0.1.{n}:8080/metrics": ray_node_page(
            [replica(n, i) for i in range(4)], f"10.0.1.{n}"
        )
        for n in range(12)
    }
    ticks: list[tuple[dict[str, Page], bool]] = []  # each tick's pages, and whether it churned
    for _ in range(6):
        rotations = extractor.rotations
        read = {url: read_page(url, text, extractor) for url, text in pages.items()}
        answered = {url: page for url, page in read.items() if isinstance(page, Page)}
        assert len(answered) == len(pages)
        ticks.append((answered, extractor.rotations != rotations))
    assert ticks[0][1] and not ticks[-1][1], [churned for _, churned in ticks]
    # the (series, bound) numbers hold what the grown label cache holds, or each tick's
    # repeated-series check would number every group afresh
    assert exposition._IDENTS.limit == 2 * extractor._labels.limit > 2 * 256
    first, before, last = ticks[0][0], ticks[-2][0], ticks[-1][0]
    for url in pages:
        assert last[url].samples == first[url].samples
        for name, samples in last[url].samples.items():
            pairs = zip(samples, before[url].samples[name], strict=True)
            assert all(a.labels is b.labels for a, b in pairs)


def test_a_replica_that_stopped_stepping_reads_idle_and_is_gone_while_its_model_is_busy() -> None:
    """Found by an audit on a real Ray head: Ray Serve replaced a dead replica (a-2) under a
    new id (a-9); Ray dropped a-2's gauges and kept its histogram on the page, and it was
    read from its gauges as last seen (KV 0.85, 4 waiting) for good. A replica not stepping
    holds nothing: it reads idle, and once it has stayed so through ``QUIET_READS`` reads in
    which its model had as many requests in flight as replicas (Ray Serve would have sent it
    work) it is gone until it steps. Two reviews shaped the rule: gone after a minute beside
    any sibling that stepped dropped a live replica at low load; gone only beside a queue
    came back whenever the queue cleared, and never went where load ran high without one."""
    r = reader(A)
    a1 = Replica(A, Load(kv=0.8, running=6, blocks=20_000), "a-1", "01" * 28)
    a2 = Replica(A, Load(kv=0.85, waiting=4, blocks=30_000), "a-2", "02" * 28)
    a9 = Replica(A, Load(kv=0.8, running=6, blocks=30_000), "a-9", "09" * 28)
    assert read(r, [node([a1, a2])]).replicas == 2
    dead = replace(a2, info=False, gauges=False)
    for _ in range(QUIET_READS - 1):
        kept = read(r, [node([a1, dead, a9])])
        assert (kept.replicas, kept.queue_depth, kept.kv_max) == (3, 0.0, 0.8)  # idle, not 0.85
    after = read(r, [node([a1, dead, a9])])
    assert (after.replicas, after.kv_mean, after.kv_tokens) == (2, 0.8, (20_000 + 30_000) * 16)
    calmer = [replace(x, load=Load(kv=0.2, blocks=x.load.blocks)) for x in (a1, a9)]
    assert read(r, [node([calmer[0], dead, calmer[1]])]).replicas == 2  # gone until it steps

    calm = reader(A)  # one request in flight for two replicas: low load, a-2 idle counts
    quiet = replace(a1, load=Load(kv=0.3, running=1, blocks=20_000))
    read(calm, [node([quiet, a2])])
    for _ in range(3 * QUIET_READS):
        metrics = read(calm, [node([quiet, dead])])
        assert (metrics.replicas, metrics.kv_tokens) == (2, (20_000 + 30_000) * 16)
        assert metrics.kv_mean == pytest.approx(0.15)

    idle = reader(A)  # nothing steps: a model gone idle is never emptied
    read(idle, [node([a1, a2])])
    asleep = [replace(x, info=False, gauges=False) for x in (a1, a2)]
    for _ in range(3 * QUIET_READS):
        metrics = read(idle, [node(asleep)])
        assert (metrics.replicas, metrics.kv_mean, metrics.queue_depth) == (2, 0.0, 0.0)


def test_after_a_start_beside_a_restart_the_process_that_steps_is_the_replica_s() -> None:
    """Found by an audit: started while a restarted replica's old worker was still on the
    page, the controller took the worker that sorts last; its histogram never leaves the
    page, so it read the dead worker's gauges as last seen for good. Now, once only one of
    them steps, that one is read; when neither does, the replica holds nothing (a review
    found the dead worker's 0.95 and 9 waiting read for good while the new one waited for
    work)."""
    r = reader(A)
    old = Replica(A, Load(kv=0.95, waiting=9, completed=5000), "a-1", "ff" * 28)
    for tick in range(6):
        new = Replica(A, Load(kv=0.1 + 0.05 * tick, completed=10 + tick), "a-1", "00" * 28)
        lingering = old if tick < 2 else replace(old, info=False, gauges=False)
        metrics = read(r, [node([lingering, new])], 10.0 * tick)
        assert metrics.replicas == 1
        if tick >= 2:
            assert metrics.kv_mean == pytest.approx(new.load.kv) and metrics.queue_depth == 0.0
    dead, idle = (replace(x, info=False, gauges=False) for x in (old, new))
    metrics = read(r, [node([dead, idle])], 60.0)
    assert (metrics.replicas, metrics.kv_mean, metrics.queue_depth) == (1, 0.0, 0.0)

    crashed = reader(A)  # the old worker crashed before the controller saw the new one step
    read(crashed, [node([old])])
    waiting = Replica(A, Load(kv=0.0, completed=0), "a-1", "00" * 28, gauges=False)
    metrics = read(crashed, [node([replace(old, info=False, gauges=False), waiting])])
    assert (metrics.replicas, metrics.kv_mean, metrics.queue_depth) == (1, 0.0, 0.0)


def test_a_restarted_process_whose_pool_was_never_seen_has_its_replica_s() -> None:
    """The pool is the replica's (the issue: keyed by ReplicaId): a worker restarted while
    the controller was not reading, its info gauge dropped before it was, keeps the pool its
    replica's earlier worker showed, said as kept, where the cluster fell to measured."""
    r = reader(A)
    first = Replica(A, Load(kv=0.5, blocks=20_000), "a-1", OLD)
    assert read(r, [node([first])], 0.0).kv_tokens == 20_000 * 16
    restarted = Replica(A, Load(kv=0.4, blocks=20_000), "a-1", NEW, info=False)
    later = read(r, [node([restarted])], 60.0)
    assert (later.kv_tokens, later.kv_tokens_from) == (20_000 * 16, CapacityFrom.KV_BLOCKS_KEPT)


def test_the_configured_size_is_for_the_replicas_that_never_said_theirs() -> None:
    """Found by an audit: one replica's pool seen, the other's never, with kv_tokens_per_pod
    set: the configured size went to both and the seen pool was thrown away."""
    seen = Replica(A, Load(kv=0.5, blocks=20_000), "a-1", "01" * 28)
    unseen = Replica(A, Load(kv=0.5, blocks=30_000), "a-2", "02" * 28, info=False)
    metrics = read(reader(A, per_pod=100_000), [node([seen, unseen])])
    assert (metrics.kv_tokens, metrics.kv_tokens_from) == (
        20_000 * 16 + 100_000,
        CapacityFrom.KV_TOKENS_PER_POD,
    )


def test_a_model_idle_since_the_controller_started_reads_idle_not_missing() -> None:
    """Found by an attack: replicas idle when the controller started (or came back after
    REPLICA_READS reads without the nodes), their gauges dropped by Ray and their histograms
    on the page, were never seen with a KV use and skipped: the cluster read missing_metric,
    was shed, and with no traffic never stepped again. While none of the model's replicas
    steps, each reads idle; once one steps, one never seen stepping counts from its first
    step (its id may be a dead worker's: its histogram stays on the page for good)."""
    r = reader(A)
    idle = [
        Replica(A, Load(kv=0.3, running=2, blocks=20_000), "a-1", "01" * 28),
        Replica(A, Load(kv=0.3, running=2, blocks=30_000), "a-2", "02" * 28),
    ]
    asleep = [replace(x, info=False, gauges=False) for x in idle]
    metrics = read(r, [node(asleep)])
    assert metrics.errors == ()
    assert (metrics.replicas, metrics.kv_mean, metrics.queue_depth) == (2, 0.0, 0.0)
    woken = read(r, [node([idle[0], asleep[1]])], 10.0)  # a-1 is sent work and steps
    assert (woken.replicas, woken.kv_mean) == (1, 0.3)
    both = read(r, [node(idle)], 20.0)
    assert (both.replicas, both.kv_mean) == (2, 0.3)


def test_ids_never_seen_stepping_leave_a_busy_model_s_dead_replica_to_go() -> None:
    """Found by an attack: every replica id on the pages counted towards the bar for a busy
    model (requests in flight at least the replicas), the dead ids Ray keeps on the page for
    good included: with 20 of them, 16 requests in flight never reached it, and a hot
    replica scaled down afterwards counted idle for good (KV 0.61 read for 0.92)."""
    r = reader(A)
    hot = [
        Replica(A, Load(kv=0.92, waiting=2, running=6, blocks=20_000), f"a-{i}", f"a{i}" * 28)
        for i in range(1, 4)
    ]
    dead = [
        Replica(A, Load(kv=0.0, blocks=20_000, completed=50), f"old-{i}", f"{i:02}" * 28)
        for i in range(20)
    ]
    dead = [replace(x, info=False, gauges=False) for x in dead]
    for tick in range(2):
        read(r, [node([*hot, *dead])], 10.0 * tick)
    down = replace(hot[2], info=False, gauges=False)  # a-3 scaled down: its histogram stays
    for tick in range(QUIET_READS):
        metrics = read(r, [node([*hot[:2], down, *dead])], 20.0 + 10 * tick)
    assert metrics.replicas == 2 and metrics.kv_mean == pytest.approx(0.92)


def test_a_replica_restarted_four_times_keeps_its_live_worker_s_state() -> None:
    """Found by an attack: a replica of five workers on the page (four dead ones' histograms
    stay) had its processes cut to four each read, the live worker's kept gauges and pool
    with them, and re-added after it in the order first seen: once idle it vanished."""
    r = reader(A)
    live = Replica(A, Load(kv=0.6, running=3, blocks=20_000, completed=100), "a-1", "00" * 28)
    dead = [
        Replica(A, Load(kv=0.9, blocks=20_000, completed=50), "a-1", f"{i}{i}" * 28)
        for i in range(1, 5)
    ]
    dead = [replace(x, info=False, gauges=False) for x in dead]
    other = Replica(A, Load(kv=0.6, running=1, blocks=20_000, completed=100), "a-2", "ee" * 28)
    for tick in range(12):
        worker = replace(live, gauges=tick < 3, info=tick == 0)
        metrics = read(r, [node([worker, *dead, replace(other, info=tick == 0)])], 10.0 * tick)
        assert (metrics.replicas, metrics.kv_tokens) == (2, 2 * 20_000 * 16), tick


def test_a_url_in_front_of_several_ray_nodes_is_named_load_balanced() -> None:
    """Found by an attack: a Service in front of the Ray nodes (KubeRay's head Service, a
    non-headless one) served one node's page, then another's, under one URL: read as one
    node whose replicas changed every scrape (2 replicas at 0.9, then 1 at 0.2), no error.
    Ray's agent names the node on every series; a URL whose pages go back to a node they
    left is several nodes. A node replaced once (a new pod behind a stable name) is not."""
    url = "http://ray-workers.llm.svc:8080/metrics"
    a = [
        Replica(A, Load(kv=0.9, running=2, blocks=20_000), "a-1", "01" * 28),
        Replica(A, Load(kv=0.9, running=2, blocks=20_000), "a-2", "02" * 28),
    ]
    b = [Replica(A, Load(kv=0.2, running=1, blocks=60_000), "a-3", "03" * 28)]

    def page(replicas: list[Replica], address: str) -> Page:
        read = read_page(url, ray_node_page(replicas, address), POD_EXTRACTOR)
        assert isinstance(read, Page)
        return read

    r = reader(A)
    reasons = [
        [e.reason for e in read(r, [page(*side)], 10.0 * i).errors]
        for i, side in enumerate([(a, "10.0.0.1"), (b, "10.0.0.2"), (a, "10.0.0.1")])
    ]
    assert reasons[:2] == [[], []] and reasons[2] == [Reason.LOAD_BALANCED]
    replaced = reader(A)
    for i, side in enumerate([(a, "10.0.0.1"), (b, "10.0.0.7"), (b, "10.0.0.7")]):
        assert read(replaced, [page(*side)], 10.0 * i).errors == ()
    # replaced twice, the third pod given the first's address long after (a review)
    later = [(b, "10.0.0.7")] * NODE_WINDOW + [(a, "10.0.0.1")]
    for i, side in enumerate(later):
        assert read(replaced, [page(*side)], 30.0 + 10 * i).errors == (), i


def test_an_idle_model_read_by_name_whatever_series_comes_first() -> None:
    """A review: the idle gauges of replicas never seen stepping took their labels from the
    replica's first series; where that was its pool's info gauge (no model_name), a cluster
    naming its model read missing_metric."""
    asleep = [
        Replica(A, Load(kv=0.3, running=2, blocks=20_000), f"a-{i}", f"0{i}" * 28, gauges=False)
        for i in (1, 2)
    ]
    metrics = read(reader(A), [node(asleep)])
    assert (metrics.replicas, metrics.kv_mean, metrics.errors) == (2, 0.0, ())


def test_a_replica_never_seen_stepping_beside_one_sent_a_request_now_and_then_holds_still() -> None:
    """A review: a replica never seen stepping counted while none stepped, so one request
    now and then to its sibling flipped the count (2, 1, 2, 1) and the capacity with it.
    Once one of the model's replicas on the pages has stepped, the others count from their
    own first step."""
    r = reader(A, per_pod=100_000)
    a1 = Replica(A, Load(kv=0.2, running=1, blocks=20_000), "a-1", "01" * 28, info=False)
    a2 = Replica(A, Load(kv=0.0, blocks=20_000), "a-2", "02" * 28, info=False, gauges=False)
    counts = [
        read(r, [node([a1 if tick % 2 else replace(a1, gauges=False), a2])], 10.0 * tick).replicas
        for tick in range(8)
    ]
    assert counts == [2, 1, 1, 1, 1, 1, 1, 1]
