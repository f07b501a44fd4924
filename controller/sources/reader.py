"""Pure: a cluster's answered /metrics pages → its ``ClusterMetrics``.

A ``PageReader`` keeps what reading needs between scrapes (``sources.between``: counter
baselines, each URL's identity).

- Pods, read by their engine's row (``controller.engines``: found on each page by its KV
  family, or the one the cluster names): KV use is the mean (and max) over every pod and
  engine process, one series each, never summed; queue and running requests are summed; what
  the cluster holds is the sum of its pods' KV pools when every answering pod publishes one
  (else answering pods × ``kv_tokens_per_pod`` where the operator gives it).
- The EPP alone: the pool's averages (KV, queue and running per endpoint), its ready endpoints
  (times ``kv_tokens_per_pod`` where the operator knows a pod's pool), its request counter as
  arrivals. An EPP with 0 ready endpoints has no fresh pod
  and its averages are frozen: stale, never idle.
- Latency: the EPP's request-duration histogram (newest name first), else the pods' engine's
  e2e one, each pod's series summed into one as it is read (``histograms.Fold``: one array
  kept per pod between scrapes, not one per engine and model).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from controller import histograms
from controller.engines import AUTO, ENGINES, Engine, Family
from controller.exposition import Extractor, PageStream, Sample
from controller.families import (
    EPP_KV,
    EPP_LATENCY,
    EPP_QUEUE,
    EPP_READY,
    EPP_REQUESTS,
    EPP_RUNNING,
    PROCESS_START,
)
from controller.histograms import Fold, Folded, Layouts
from controller.model import CapacityFrom, ClusterMetrics, Latency, PodError, Reason
from controller.settings import ClusterSettings
from controller.sources import MAX_IN_FLIGHT, kv_tokens_problem, pod_count_problem
from controller.sources.between import (
    REPLICA_READS,
    Continuity,
    Counters,
    LatencyWindow,
    Replicas,
)
from controller.sources.page import (
    ByName,
    Page,
    finite,
    first_family,
    kept,
    labels_text,
    matching,
    of_family,
    pod_extractors,
    pod_kv,
    pool_tokens,
    replicas_on,
    series_of,
    valid_fraction,
)


@dataclass(frozen=True, slots=True)
class Summary:
    """The cluster-level numbers from the pages that answered; ``None`` is unknown."""

    kv_mean: float | None
    kv_max: float | None
    kv_family: str | None
    queue_depth: float | None
    queue_per_pod: float | None
    running: float | None
    observed_at: float | None
    invalid_samples: int
    observed_newest: float | None = None
    ready: float | None = None
    kv_tokens: float | None = None
    kv_tokens_from: str | None = None
    engine: str | None = None
    notices: tuple[PodError, ...] = ()  # what was read past (a pool no GPU holds)
    replicas: int | None = None  # read from pages that hold several (Ray Serve's)


class _PodKV(NamedTuple):
    """An answering pod's page, the engine that wrote it (``None``: no engine's KV family is
    on it) and its KV series (``pod_kv``); for a replica read from a node page (Ray Serve),
    its id and process, and ``page`` holds its series alone."""

    page: Page
    engine: Engine | None
    family: str | None
    samples: list[Sample]
    replica: tuple[str, str] | None = None


# A read's replicas over its node pages: replica → process → (the node page, its series there)
_Units = dict[str, dict[str, tuple[Page, ByName]]]


@dataclass(slots=True)
class _KV:
    values: list[float]
    invalid: int = 0
    family: str | None = None
    oldest: float | None = None
    newest: float | None = None

    def add(self, family: str, samples: Sequence[Sample]) -> None:
        self.family = self.family or family
        for sample in samples:
            if not valid_fraction(sample.value):
                self.invalid += 1
                continue
            # One series per engine: each is a fraction of its own cache; never summed.
            self.values.append(sample.value)
            if sample.timestamp is not None:
                self.oldest = min(self.oldest or sample.timestamp, sample.timestamp)
                self.newest = max(self.newest or sample.timestamp, sample.timestamp)


class PageReader:
    """Turns a cluster's answered pages into ClusterMetrics; holds what it needs between
    scrapes (counter baselines, each URL's identity)."""

    def __init__(
        self,
        cluster: ClusterSettings,
        min_latency_requests: float,
        engines: Mapping[str, Engine] = ENGINES,
    ) -> None:
        """``engines``: the table to read pages by (``Settings.engine_table``)."""
        self._name = cluster.name
        self._has_pods = bool(cluster.vllm_urls) or cluster.pods is not None
        self._pod_tokens = cluster.kv_tokens_per_pod
        self._model = cluster.model_name
        self._model_keep = {"model_name": cluster.model_name} if cluster.model_name else None
        # The rows a pod page may be read by: the one the cluster names, or each in turn
        # until one's KV family is on the page (``engine: auto``).
        named = cluster.engine != AUTO
        self._engines = (engines[cluster.engine],) if named else tuple(engines.values())
        self._extractor, self._lean = pod_extractors(tuple(engines.values()))
        # The engine its pods' last pages were written by: whose e2e buckets are folded
        # as the next pages are read (``pod_stream``).
        self._engine = self._engines[0]
        self._pool_keep = {"name": cluster.pool_name} if cluster.pool_name else None
        self._latency = LatencyWindow(min_latency_requests)
        self._layouts = Layouts()  # how this cluster's pods lay out their e2e buckets
        self._requests = Counters()
        self._continuity = Continuity()
        # the EPP's last page carried the request-duration histogram (see ``pod_extractor``)
        self._epp_latency = False
        self._replicas = Replicas()
        # a replica's URL → its node's, and reads since it was last read: what is kept of
        # it (latency, continuity) goes with its node, or after REPLICA_READS
        self._replica_nodes: dict[str, str] = {}
        self._replica_unseen: dict[str, int] = {}
        self._notice: PodError | None = None  # this read's, of the replicas (mixed models)

    @property
    def pod_extractor(self) -> Extractor:
        """What to read this cluster's pod pages with: without their e2e buckets while its
        EPP gives latency (once it fails or stops, the next scrape reads them again; their
        latency then counts from the scrape after, as it would for a new pod)."""
        return self._lean if self._epp_latency else self._extractor

    def pod_stream(self) -> PageStream:
        """A pod page's stream: read with ``pod_extractor``, and where that reads the e2e
        buckets (the pods' own histograms give the latency), the buckets folded as they are
        read (``Fold``)."""
        extractor, latency = self.pod_extractor, self._engine.latency
        # a node page's replicas are folded each on its own, once told apart (``_folded``)
        if extractor is self._lean or latency is None or self._engine.replica_label:
            return PageStream(extractor)
        return PageStream(extractor, fold=Fold(latency, self._keep(self._engine), self._layouts))

    def _keep(self, engine: Engine) -> dict[str, str] | None:
        """The labels a series of ``engine`` must carry: the cluster's model, if it names one."""
        return {engine.model_label: self._model} if self._model else None

    def read(
        self,
        results: Sequence[Page | PodError],
        epp: Page | PodError | None,
        started: float,
        duration: float,
        lookup: Sequence[PodError] = (),
    ) -> ClusterMetrics:
        """``results``: one entry per vLLM pod; ``epp``: the EPP's, if configured;
        ``lookup``: why finding the pods or the pool's EPP failed this tick (what was found
        before is read)."""
        kvs: list[_PodKV] = []
        errors: list[PodError] = []
        nodes: list[Page] = []  # the pages that answered, pods' or Ray nodes'
        units: _Units = {}  # the model's replicas → process → (node page, its series there)
        row: Engine | None = None  # the row of the node pages, if any
        self._layouts.begin(len(results))
        for result in results:
            if isinstance(result, PodError):
                errors.append(result)
                continue
            engine, name, chosen = self._engine_of(result)
            if engine is not None and engine.replica_label is not None:
                row = engine
                if isinstance(named := self._identify_node(result, engine), PodError):
                    errors.append(named)
                    continue
                nodes.append(result)
                for replica, processes in replicas_on(result, engine).items():
                    for process, (samples, models) in processes.items():
                        if self._model is None or self._model in models:
                            units.setdefault(replica, {})[process] = (result, samples)
                continue
            checked = self._check_pod(result, engine, name, chosen)
            if isinstance(checked, _PodKV):
                kvs.append(checked)
                nodes.append(result)
            else:
                errors.append(checked)
        replicated = row is not None
        self._notice = None
        if row is not None:
            # a node without the row's series (a KubeRay head) holds no replica: a node
            # that answered, never a pod of unknown engine
            kvs = [kv for kv in kvs if kv.engine is not None]
            found, wrong, refused = self._replicas_of(units, row)
            kvs += found
            errors += wrong
            nodes = [n for n in nodes if n.url not in refused]
        self._replicas.read()
        self._age_replicas(results, epp)
        if isinstance(epp, Page):
            epp = self._identify(epp, [f + "_count" for f in EPP_LATENCY])
        errors += [*([epp] if isinstance(epp, PodError) else []), *lookup]
        epp_page = epp if isinstance(epp, Page) else None
        if self._has_pods:
            values = self._from_pods(kvs, replicated)
            scraped, answering = len(results), len(nodes)
        else:
            values, error = self._from_epp_pool(epp_page)
            errors += [error] if error else []
            scraped, answering = 1, int(epp_page is not None and error is None)
        answered = nodes if self._has_pods else ([epp_page] if epp_page and answering else [])
        if answered and values.kv_mean is None:
            errors.append(self._missing(len(answered)))
        latency, fell = self._latency_from(epp_page, kvs)
        read = [*nodes, *([epp_page] if epp_page else [])]
        return ClusterMetrics(
            cluster=self._name,
            scraped_at=started,
            duration=duration,
            pods_scraped=scraped,
            pods_answering=answering,
            kv_mean=values.kv_mean,
            kv_max=values.kv_max,
            kv_family=values.kv_family,
            queue_depth=values.queue_depth,
            queue_per_pod=values.queue_per_pod,
            running=values.running,
            latency=latency,
            observed_at=values.observed_at,
            observed_newest=values.observed_newest,
            invalid_samples=values.invalid_samples + sum(p.skipped for p in read),
            duplicate_samples=sum(p.duplicates for p in read),
            errors=tuple(errors),
            notices=(
                *(n for p in read for n in p.notices),
                *values.notices,
                *([self._notice] if self._notice else []),
            ),
            pages=len(results) + (epp is not None),
            # the increase between two scrapes: what completed since the last one (unknown
            # when a counter fell: a restart, or another process behind the URL)
            completed=latency.requests if latency is not None and not fell else None,
            arrived=self._arrivals(epp_page),
            ready=values.ready,
            kv_tokens=values.kv_tokens,
            kv_tokens_from=values.kv_tokens_from,
            engine=values.engine,
            replicas=values.replicas,
        )

    def retain(self, urls: Sequence[str]) -> None:
        """Forget what is kept of pages no longer read (pods discovery no longer finds), and
        of the replicas on them."""
        keep = set(urls)
        keep |= {unit for unit, node in self._replica_nodes.items() if node in keep}
        self._forget_replicas_but(keep)

    def _missing(self, answered: int) -> PodError:
        """Pages came back but none carries KV use: say which names were looked for."""
        names = " or ".join([str(e.kv) for e in self._engines] if self._has_pods else list(EPP_KV))
        keep = self._model_keep or self._pool_keep
        scope = f" for {keep}" if keep else ""
        detail = f"no {names} series{scope} on {answered} page(s) that answered"
        return PodError("*", Reason.MISSING_METRIC, detail)

    def _from_pods(self, kvs: Sequence[_PodKV], replicated: bool = False) -> Summary:
        kv = _KV(values=[])
        waiting: list[float] = []
        running: list[float] = []
        pools: list[float | None] = []
        notices: list[PodError] = []
        remembered = 0
        for pod, engine, family, samples, replica in kvs:
            if family is not None:
                kv.add(family, samples)
            if engine is None:
                pools.append(None)
                continue
            keep = self._keep(engine)
            waiting += _pod_total(pod.samples, engine.waiting, keep)
            running += _pod_total(pod.samples, engine.running, keep)
            pool = pool_tokens(pod.samples, engine.pools, keep)
            if pool is not None and (why := kv_tokens_problem(pool, 1.0, "its KV pool")):
                # a pool no GPU holds is no capacity: unknown (measured), and named
                notices.append(PodError(pod.url, Reason.OUT_OF_RANGE, why))
                pool = None
            if replica is not None:
                pool, kept_ = self._replicas.pool(*replica, pool)
                remembered += kept_
            pools.append(pool)
        summary = _summary(kv, waiting, running, per_pod=len(waiting) or None)
        engines = sorted({kv.engine.name for kv in kvs if kv.engine is not None})
        summary = replace(
            summary,
            engine="+".join(engines) or None,
            notices=tuple(notices),
            replicas=len(kvs) if replicated else None,
        )
        if pools and all(p is not None for p in pools):  # every pod says what it holds
            tokens = sum(p for p in pools if p is not None)
            # Ray drops a pool's gauge once it is not set again: kept as last seen, and said
            source = CapacityFrom.KV_BLOCKS_KEPT if remembered else CapacityFrom.KV_BLOCKS
            return replace(summary, kv_tokens=tokens, kv_tokens_from=source)
        if pools and self._pod_tokens:  # the operator says what a pod that does not say holds
            tokens = sum(self._pod_tokens if p is None else p for p in pools)
            return replace(summary, kv_tokens=tokens, kv_tokens_from=CapacityFrom.KV_TOKENS_PER_POD)
        return summary

    def _check_pod(
        self,
        page: Page,
        engine: Engine | None,
        name: str | None,
        chosen: list[Sample],
        replica: tuple[str, str] | None = None,
    ) -> _PodKV | PodError:
        if name is not None and chosen and not any(valid_fraction(s.value) for s in chosen):
            bad = chosen[0]
            hint = " (a percentage? it must be a fraction 0..1)" if 1 < bad.value <= 100 else ""
            detail = f"{name}{{{labels_text(series_of(bad))}}}={bad.value:g} is outside 0..1{hint}"
            return PodError(page.url, Reason.OUT_OF_RANGE, detail)
        identified = self._identify(page, _counters(engine))
        if not isinstance(identified, Page):
            return identified
        return _PodKV(page, engine, name, chosen, replica)

    def _replicas_of(
        self, units: _Units, engine: Engine
    ) -> tuple[list[_PodKV], list[PodError], set[str]]:
        """The replicas of the cluster's model on this read's node pages, each read as a pod
        of its own (its series alone, under its own URL: ``node#ReplicaId=…,WorkerId=…``),
        by the process that is the replica's now (``Replicas.current``, over every node page:
        a replica is one whichever node shows it); what is wrong with them; and the nodes
        whose every replica of the model was refused (they do not count as answering).

        A replica whose gauges Ray dropped (vLLM sets them as its engine steps; an idle one
        stops, and Ray drops a gauge not set again) while its other series stay is read as
        not stepping: nothing running, waiting or held (``Replicas.gauges``); it is gone
        once it stays so through ``QUIET_READS`` reads in which the model's replicas that step
        had as many requests in flight as the model has replicas, until it steps again
        (``Replicas.gone``). One never seen stepping reads so while none of the model's
        replicas steps, and counts from its first step once one does."""
        found: list[_PodKV] = []
        wrong: list[PodError] = []
        accepted: set[str] = set()
        refused: set[str] = set()
        families = (engine.kv, engine.waiting, engine.running)
        gauges = {n for family in families for n in family.names}
        picked: list[tuple[str, str, Page, ByName, bool]] = []  # and: stepping now
        ongoing = 0.0  # requests running or waiting at the replicas of the model that step
        keep = self._keep(engine)
        for replica, mine in units.items():  # the cluster's model's (``read``)
            live = [p for p, (_, on) in mine.items() if any(n in on for n in gauges)]
            process = self._replicas.current(replica, list(mine), live)
            node, samples = mine[process]
            if process in live:
                ongoing += sum(_pod_total(samples, engine.waiting, keep))
                ongoing += sum(_pod_total(samples, engine.running, keep))
            picked.append((replica, process, node, samples, process in live))
        # A replica never seen stepping is the model's while none of its replicas on the
        # pages ever stepped: a model idle since the controller started reads idle, not
        # missing (read as missing, it was shed, and with no traffic never stepped again: an
        # attack). Once one has, such an id may be a dead worker's (its histogram stays on
        # the page for good) and counts from its first step.
        stepped = [p for p in picked if p[4] or self._replicas.stepped(p[0])]
        if stepped:  # one seen stepping, now or before: those alone (a review: counted
            picked = stepped  # until a sibling stepped, an idle one flapped in and out)
        # Ray Serve sends each request to the less loaded of two replicas drawn at random: with
        # as many requests in flight as replicas, a live one that does not step is sent work.
        # Those gone count no more (a dead id's histogram stays on the page for good: counted,
        # 20 of them kept a hot model's dead replica from ever going, an attack).
        busy = ongoing >= sum(1 for replica, *_ in picked if not self._replicas.gone(replica))
        for replica, process, node, samples, _ in picked:
            samples = self._replicas.gauges(
                replica, process, samples, families, busy, engine.model_label
            )
            if self._replicas.gone(replica):
                continue  # not stepping through QUIET_READS busy reads: gone until it steps
            name, chosen = self._kv_of(samples, engine)
            if name is None:
                continue  # no series of the model's left to read it by
            unit = f"{node.url}#{engine.replica_label}={replica}"
            if engine.process_label:
                unit += f",{engine.process_label}={process}"
            self._replica_nodes[unit] = node.url
            self._replica_unseen[unit] = 0
            checked = self._check_pod(Page(unit, samples), engine, name, chosen, (replica, process))
            if isinstance(checked, _PodKV):
                found.append(checked)
                accepted.add(node.url)
            else:
                wrong.append(checked)
                refused.add(node.url)
        models = {kv.samples[0].labels.get(engine.model_label, "") for kv in found}
        if len(models) > 1:  # a node page holds every model's replicas: name the model
            detail = (
                f"replicas of {len(models)} models ({', '.join(sorted(models))}) read as one "
                "cluster: give the cluster model_name"
            )
            self._notice = PodError("*", Reason.MIXED_MODELS, detail)
        return found, wrong, refused - accepted

    def _age_replicas(
        self, results: Sequence[Page | PodError], epp: Page | PodError | None
    ) -> None:
        """One read more since each replica was last read; what is kept of one unread for
        REPLICA_READS reads is forgotten (with its node still listed, nothing else would)."""
        gone = []
        for unit in self._replica_unseen:
            self._replica_unseen[unit] += 1
            if self._replica_unseen[unit] > REPLICA_READS:
                gone.append(unit)
        if gone:
            for unit in gone:
                del self._replica_unseen[unit]
                del self._replica_nodes[unit]
            pages = [r.url for r in (*results, epp) if r is not None]
            self._forget_replicas_but({*pages, *self._replica_unseen})

    def _forget_replicas_but(self, keep: set[str]) -> None:
        self._latency.retain(keep)
        self._continuity.retain(keep)
        self._replica_nodes = {u: n for u, n in self._replica_nodes.items() if u in keep}
        self._replica_unseen = {u: n for u, n in self._replica_unseen.items() if u in keep}

    def _kv_of(self, samples: ByName, engine: Engine) -> tuple[str | None, list[Sample]]:
        """A pod's KV series by ``engine``'s row, of the cluster's model (``pod_kv``)."""
        keep = self._keep(engine)
        found = [matching(kept(samples.get(n, ()), keep), engine.kv) for n in engine.kv.names]
        return pod_kv(found, engine.kv.names)

    def _engine_of(self, page: Page) -> tuple[Engine | None, str | None, list[Sample]]:
        """The engine whose KV family is on the page (the first of the cluster's rows that
        has one; with a single row, that row even without), its KV name and series. A row
        whose pages hold replicas (``Engine.replica_label``) is the page's by any of its
        families, of any model (an idle replica's gauges may be gone, its histogram stays):
        which replicas are the cluster's model's is for ``_replicas_of``."""
        for engine in self._engines:
            if engine.replica_label and any(n in page.samples for n in _families(engine)):
                self._engine = engine
                return engine, None, []
            name, chosen = self._kv_of(page.samples, engine)
            if name is not None:
                self._engine = engine
                return engine, name, chosen
        only = self._engines[0] if len(self._engines) == 1 else None
        return only, None, []

    def _identify_node(self, page: Page, engine: Engine) -> Page | PodError:
        """A Ray node's page, or why its URL is several nodes: by the node address Ray's
        agent puts on every series (``Engine.node_label``), which one node's page never
        changes."""
        label = engine.node_label
        if label is None:
            return page
        names = _families(engine)
        series = (s for name in names for s in page.samples.get(name, ()) if label in s.labels)
        node = next((s.labels[label] for s in series), None)
        why = self._continuity.check(page.url, None, None, node)
        if why is None:
            return page
        detail = (
            f"this URL answers as more than one Ray node ({why}): a Service in front of the "
            "nodes? List each node's metrics port, or discover the pods"
        )
        return PodError(page.url, Reason.LOAD_BALANCED, detail)

    def _identify(self, page: Page, counters: Sequence[str]) -> Page | PodError:
        """The page, or why its URL is several processes (``Continuity``): by the first of
        ``counters`` (requests completed since the process started) on the page, and the
        process start time."""
        counts = first_family(page.samples, counters, None)
        total = sum(finite(counts[1])) if counts else None
        start = finite(page.samples.get(PROCESS_START, ()))
        why = self._continuity.check(page.url, total, start[0] if len(start) == 1 else None)
        if why is None:
            return page
        detail = (
            f"this URL answers as more than one process ({why}): a Service or load balancer "
            "in front of several pods? List each pod, discover them (pods.dns), or read the "
            "cluster through its EPP"
        )
        return PodError(page.url, Reason.LOAD_BALANCED, detail)

    def _from_epp_pool(self, page: Page | None) -> tuple[Summary, PodError | None]:
        kv = _KV(values=[])
        if page is None:
            return _summary(kv, [], [], per_pod=None), None
        ready = first_family(page.samples, EPP_READY, self._pool_keep)
        endpoints = sum(finite(ready[1])) if ready else None
        if ready and endpoints is not None and (why := pod_count_problem(endpoints, ready[0])):
            return _summary(kv, [], [], per_pod=None), PodError(page.url, Reason.OUT_OF_RANGE, why)
        if endpoints is not None and endpoints <= 0:
            detail = (
                f"{ready[0] if ready else ''} is 0: no endpoint of the pool has fresh metrics, "
                "so the EPP's averages are frozen at their last values"
            )
            return _summary(kv, [], [], per_pod=None), PodError(page.url, Reason.STALE, detail)
        found = first_family(page.samples, EPP_KV, self._pool_keep)
        if found is not None:
            kv.add(*found)
        per_pod = _mean_of(page, EPP_QUEUE, self._pool_keep)
        running = _mean_of(page, EPP_RUNNING, self._pool_keep)
        tokens = endpoints * self._pod_tokens if endpoints and self._pod_tokens else None
        summary = replace(
            _summary(kv, [], [], per_pod=None),
            queue_per_pod=per_pod,
            queue_depth=per_pod * endpoints if per_pod is not None and endpoints else None,
            running=running * endpoints if running is not None and endpoints else None,
            ready=endpoints or None,
            kv_tokens=tokens,
            kv_tokens_from=CapacityFrom.KV_TOKENS_PER_POD if tokens else None,
        )
        return summary, None

    def _arrivals(self, epp: Page | None) -> float | None:
        """Requests the EPP scheduled since its last scrape (its request counter)."""
        if epp is None:
            return None
        found = first_family(epp.samples, EPP_REQUESTS, self._model_keep)
        return self._requests.increase(epp.url, found[1]) if found else None

    def _latency_from(
        self, epp: Page | None, pods: Sequence[_PodKV]
    ) -> tuple[Latency | None, bool]:
        if epp is not None:
            for family in EPP_LATENCY:
                series = histograms.collect(epp.samples, family, self._model_keep)
                if series:
                    self._epp_latency = True
                    return self._latency.observe(family, [(epp.url, series)])
        self._epp_latency = False
        pages = [(p.page.url, self._folded(p.page, p.engine)) for p in pods]
        if not any(folded for _, folded in pages):
            return None, False
        return self._latency.observe_folded(self._engine.latency or "", pages)

    def _folded(self, page: Page, engine: Engine | None) -> Folded | None:
        """A pod's e2e series as one (``Fold``): what is kept of it until the next scrape;
        folded as it was read, or here from its samples (a page read without ``pod_stream``,
        or whose engine was not yet known when it was)."""
        latency = engine.latency if engine is not None else None
        if latency is None:
            return None
        fold = page.fold
        if fold is None or fold.sample_name != latency + "_bucket":
            fold = Fold(latency, self._keep(engine) if engine else None, self._layouts)
            fold.add_samples(page.samples.get(latency + "_bucket", ()))
        return fold.folded(page.samples)


def _mean_of(page: Page, families: Sequence[str], keep: Mapping[str, str] | None) -> float | None:
    found = first_family(page.samples, families, keep)
    values = finite(found[1]) if found else []
    return sum(values) / len(values) if values else None


def _pod_total(page: ByName, family: Family, keep: Mapping[str, str] | None) -> list[float]:
    """A pod's total for an additive gauge (summed over its engine processes), or nothing if
    absent; a count below 0 is none (an attack's page made the integral law's queue penalty a
    complex number), and so is one past ``MAX_IN_FLIGHT`` (1e300 read as a queue)."""
    found = of_family(page, family, keep)
    values = [v for v in finite(found[1]) if 0 <= v <= MAX_IN_FLIGHT] if found else []
    total = _total(values)
    return [total] if total is not None else []


def _total(counts: list[float]) -> float | None:
    """Pods' counts summed; none where they sum past a float's range (two pods at 1.7e308:
    the utilization made of it was NaN, and the cluster never under pressure)."""
    total = sum(counts) if counts else None
    return total if total is not None and math.isfinite(total) else None


def _summary(kv: _KV, waiting: list[float], running: list[float], per_pod: int | None) -> Summary:
    queue = _total(waiting)
    return Summary(
        kv_mean=sum(kv.values) / len(kv.values) if kv.values else None,
        kv_max=max(kv.values) if kv.values else None,
        kv_family=kv.family,
        queue_depth=queue,
        queue_per_pod=queue / per_pod if queue is not None and per_pod else None,
        running=_total(running),
        observed_at=kv.oldest,
        observed_newest=kv.newest,
        invalid_samples=kv.invalid,
    )


def _families(engine: Engine) -> list[str]:
    """The sample names that say a page is ``engine``'s."""
    names = [*engine.kv.names, *engine.waiting.names, *engine.running.names]
    return names + ([engine.latency + "_count"] if engine.latency else [])


def _counters(engine: Engine | None) -> list[str]:
    """What says how many requests a pod's process completed: its e2e histogram's count, or
    the row's own counter where it has no histogram (Triton)."""
    if engine is None:
        return []
    if engine.latency:
        return [engine.latency + "_count"]
    return [engine.completed] if engine.completed else []
