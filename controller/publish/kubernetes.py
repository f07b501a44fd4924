"""Writes weights into ExternalModels (and configured HTTPRoutes), safely.

Every tick: list the opted-in ExternalModels and their ExternalProviders (each object parsed
again only when its resourceVersion changed), decide each target's weights over the clusters
its refs map to — starting from what the object holds now, so a restart or a failover picks up
where the last writer left off — and, on the leader, patch what changed:

- a JSON Patch whose ``test`` ops pin each ref's name at its index (a reordered list gets a 422,
  never wrong weights); on 409/422 re-read and decide again, ``write_retries`` times at most;
- 404: the target is gone, forget it; 403: an error naming the missing verb and resource;
- the applied weights and time go into the ``last-applied`` annotation, and an Event is emitted;
- a weight someone else changed is overwritten only by a decision made from a fresh read, and
  the log names who changed it (from managedFields).

When the API server is unreachable the known targets are kept: weights are still decided and
exported as desired (``weight_controller_desired_weight``), and the latest decision is applied
once the API answers again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import structlog
from kubernetes_asyncio import client

from controller import weights
from controller.exporter import ControllerMetrics, Snapshot, TargetView
from controller.kube import objects
from controller.kube.errors import (
    API_EXCEPTIONS,
    APIConflictError,
    APIError,
    APIForbiddenError,
    APIInvalidError,
    APINotFoundError,
    translate,
)
from controller.kube.objects import ProviderMapping, Target
from controller.model import Decision, Mode, Signals
from controller.settings import ClusterSettings, HTTPRouteTarget, Settings, WeightSettings

log = structlog.get_logger("controller.publish")
T = TypeVar("T")
TOTAL = 100


def target_weights(
    target: Target, signals: Mapping[str, Signals | None], params: WeightSettings
) -> tuple[dict[str, int] | None, Decision]:
    """Pure: the weights this target's refs should hold, by ref name (``None``: leave it).

    Refs with no known cluster keep their weight; the mapped refs share what is left of 100.
    A ref's cluster that has no signals this tick counts as unhealthy.
    """
    mapped = [ref for ref in target.refs if ref.cluster is not None]
    budget = TOTAL - sum(ref.weight for ref in target.refs if ref.cluster is None)
    if not mapped or budget < len(mapped):
        note = "no ref maps to a known cluster" if not mapped else "unmapped refs hold it all"
        return None, Decision(None, {}, Mode.NO_DATA, False, (note,))
    inputs = {ref.name: signals.get(ref.cluster or "") for ref in mapped}
    current = {ref.name: ref.weight for ref in mapped}
    in_force = weights.proportional(current, TOTAL) if sum(current.values()) > 0 else None
    decision = weights.decide(inputs, in_force, params)
    if not decision.changed or decision.weights is None:
        return None, decision
    return weights.proportional(decision.weights, budget), decision


@dataclass(slots=True)
class _Cache:
    """Parsed targets by uid, reused while the resourceVersion (and the mapping) is unchanged."""

    parsed: dict[str, tuple[str, ProviderMapping, Target]] = field(default_factory=dict)

    def get(self, obj: Mapping[str, Any], mapping: ProviderMapping) -> Target:
        meta = obj.get("metadata", {})
        uid, version = str(meta.get("uid", "")), str(meta.get("resourceVersion", ""))
        hit = self.parsed.get(uid)
        if hit is not None and hit[0] == version and hit[1] == mapping:
            return hit[2]
        target = objects.external_model(obj, mapping)
        self.parsed[uid] = (version, mapping, target)
        return target


class KubernetesPublisher:
    def __init__(
        self,
        settings: Settings,
        api: client.ApiClient,
        metrics: ControllerMetrics,
        snapshot: Snapshot,
        is_leader: Callable[[], bool] = lambda: True,
        dry_run: bool = False,
    ) -> None:
        self._settings = settings
        self._kube = settings.kubernetes
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._metrics = metrics
        self._snapshot = snapshot
        self._is_leader = is_leader
        self._dry_run = dry_run
        self._targets: dict[str, Target] = {}
        self._last_write: dict[str, float] = {}
        self._defined: list[ClusterSettings] = []
        self._cache = _Cache()
        self._configured = {c.name for c in settings.clusters}
        self._routes = {(r.namespace, r.name): r for r in self._kube.httproutes}
        # Provider mappings from the last discovery, reused when a written or re-read object
        # is parsed again in the same tick (instead of listing the providers once per write).
        self._mappings: dict[str, ProviderMapping] = {}

    @property
    def targets(self) -> Mapping[str, Target]:
        return self._targets

    # ---- discovery ---------------------------------------------------------------------------
    async def discover(self) -> Sequence[ClusterSettings]:
        """Refresh the targets; returns the clusters ExternalProviders define by annotation."""
        try:
            targets, defined = await self._read_targets()
        except APIError as exc:
            self._count(exc)
            log.warning(
                "cannot read targets; keeping the last known",
                error=str(exc),
                targets=len(self._targets),
            )
            return self._defined
        self._targets = {t.key: t for t in targets}
        self._defined = defined
        self._cache.parsed = {t.uid: v for t in targets if (v := self._cache.parsed.get(t.uid))}
        return defined

    async def _read_targets(self) -> tuple[list[Target], list[ClusterSettings]]:
        targets: list[Target] = []
        defined: list[ClusterSettings] = []
        for namespace in self._kube.namespaces:
            mapping = self._mappings[namespace] = await self._providers(namespace)
            defined += mapping.defined
            for obj in await self._list_models(namespace):
                model = self._cache.get(obj, mapping)
                if len(model.refs) >= 2 and self._usable(model):
                    targets.append(model)
        for route in self._routes.values():
            found = await self._read_httproute(route)
            if found is not None and self._usable(found):
                targets.append(found)
        return targets, defined

    async def _list_models(self, namespace: str) -> list[dict[str, Any]]:
        found = await self._call(
            f"list externalmodels in {namespace}",
            lambda: self._custom.list_namespaced_custom_object(
                *objects.EXTERNAL_MODEL[:2],
                namespace,
                objects.EXTERNAL_MODEL[2],
                label_selector=self._kube.label_selector,
            ),
        )
        return list(found.get("items", []))

    async def _providers(self, namespace: str) -> ProviderMapping:
        found = await self._call(
            f"list externalproviders in {namespace}",
            lambda: self._custom.list_namespaced_custom_object(
                *objects.EXTERNAL_PROVIDER[:2], namespace, objects.EXTERNAL_PROVIDER[2]
            ),
        )
        mapping = objects.map_providers(found.get("items", []), self._configured)
        for problem in mapping.problems:
            log.warning("ignoring provider annotations", problem=problem)
        return mapping

    async def _read_httproute(self, config: HTTPRouteTarget) -> Target | None:
        namespace, name = config.namespace, config.name
        try:
            obj = await self._call(
                f"get httproutes {namespace}/{name}",
                lambda: self._custom.get_namespaced_custom_object(
                    *objects.HTTPROUTE[:2], namespace, objects.HTTPROUTE[2], name
                ),
            )
        except APINotFoundError:
            log.warning("configured HTTPRoute not found", target=f"{namespace}/{name}")
            return None
        return objects.httproute(obj, config)

    def _usable(self, target: Target) -> bool:
        names = [ref.name for ref in target.refs]
        if len(set(names)) != len(names):
            log.warning("skipping target: a ref name appears twice", target=target.key)
            return False
        for ref in target.refs:
            if ref.cluster is None:
                log.warning(
                    "ref maps to no known cluster; keeping its weight",
                    target=target.key,
                    ref=ref.name,
                    weight=ref.weight,
                )
        return True

    # ---- deciding and writing ----------------------------------------------------------------
    async def publish(self, signals: Mapping[str, Signals | None], fleet: Decision) -> None:
        views: dict[str, TargetView] = {}
        for key, target in list(self._targets.items()):
            view = await self._reconcile(target, signals)
            if key in self._targets:  # not forgotten (deleted) meanwhile
                views[key] = view
        self._snapshot.targets = views

    async def _reconcile(self, target: Target, signals: Mapping[str, Signals | None]) -> TargetView:
        desired, decision = target_weights(target, signals, self._settings.weights)
        if desired is not None and not self._dry_run and self._is_leader():
            target = await self._write_with_retries(target, signals) or target
        return TargetView(
            kind=target.kind,
            namespace=target.namespace,
            name=target.name,
            desired={**target.weights, **(desired or {})},
            applied=target.weights,
            clusters={ref.name: ref.cluster for ref in target.refs},
            mode=decision.mode,
            last_write=self._last_write.get(target.key),
        )

    async def _write_with_retries(
        self, target: Target, signals: Mapping[str, Signals | None]
    ) -> Target | None:
        """Decide from ``target`` and write; on a conflict re-read and decide again."""
        for attempt in range(1, self._kube.write_retries + 1):
            desired, decision = target_weights(target, signals, self._settings.weights)
            if desired is None:
                return target
            try:
                return await self._write(target, desired, decision)
            except (APIConflictError, APIInvalidError) as exc:
                self._count(exc)
                log.info(
                    "write conflict; re-reading", target=target.key, attempt=attempt, error=str(exc)
                )
                fresh = await self._reread(target)
                if fresh is None:
                    return None
                target = fresh
            except APINotFoundError:
                self._forget(target)
                return None
            except APIForbiddenError as exc:
                self._count(exc)
                log.error(
                    "not allowed to write weights",
                    target=target.key,
                    error=str(exc),
                    fix=f"grant verb 'patch' on {_resource(target)} in {target.namespace}",
                )
                return None
            except APIError as exc:
                self._count(exc)
                log.warning("write failed; will retry next tick", target=target.key, error=str(exc))
                return None
        log.warning("gave up after conflicts; next tick decides again", target=target.key)
        return None

    async def _reread(self, target: Target) -> Target | None:
        group, version, plural = _gvp(target)
        try:
            obj = await self._call(
                f"get {plural} {target.namespace}/{target.name}",
                lambda: self._custom.get_namespaced_custom_object(
                    group, version, target.namespace, plural, target.name
                ),
            )
            return await self._parse(obj, target)
        except APINotFoundError:
            self._forget(target)
        except APIError as exc:
            self._count(exc)
            log.warning("re-read failed", target=target.key, error=str(exc))
        return None

    async def _parse(self, obj: Mapping[str, Any], like: Target) -> Target:
        if like.kind == "HTTPRoute":
            return objects.httproute(obj, self._routes[(like.namespace, like.name)])
        mapping = self._mappings.get(like.namespace) or await self._providers(like.namespace)
        return objects.external_model(obj, mapping)

    async def _write(
        self, target: Target, desired: Mapping[str, int], decision: Decision
    ) -> Target:
        mine = {ref.name: ref.weight for ref in target.refs if ref.name in desired}
        self._note_foreign_change(target, mine, desired)
        stamp = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        patch = objects.weight_patch(target, desired, stamp)
        group, version, plural = _gvp(target)
        obj = await self._call(
            f"patch {plural} {target.namespace}/{target.name}",
            lambda: self._custom.patch_namespaced_custom_object(
                group,
                version,
                target.namespace,
                plural,
                target.name,
                patch,
                field_manager=self._kube.field_manager,
            ),
        )
        written = await self._parse(obj, target)
        self._metrics.target_writes.labels(target.kind).inc()
        change = " ".join(f"{n}={mine.get(n)}->{w}" for n, w in sorted(desired.items()))
        log.info("weights written", target=target.key, mode=decision.mode.value, change=change)
        await self._event(target, f"Weights changed ({decision.mode.value}): {change}")
        self._targets[target.key] = written
        self._last_write[target.key] = time.time()
        return written

    def _note_foreign_change(
        self, target: Target, current: Mapping[str, int], desired: Mapping[str, int]
    ) -> None:
        ours = target.last_applied
        if ours is not None and dict(ours) != dict(current):
            log.warning(
                "replacing weights changed outside the controller",
                target=target.key,
                changed_by=target.last_writer,
                found=_fmt(current),
                last_applied_by_us=_fmt(ours),
                new=_fmt(desired),
            )

    async def _event(self, target: Target, message: str) -> None:
        now = datetime.now(UTC)
        group, version, _ = _gvp(target)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                generate_name=f"{target.name}.", namespace=target.namespace
            ),
            involved_object=client.V1ObjectReference(
                api_version=f"{group}/{version}",
                kind=target.kind,
                name=target.name,
                namespace=target.namespace,
                uid=target.uid,
            ),
            reason="WeightsChanged",
            message=message,
            type="Normal",
            source=client.V1EventSource(component="weight-controller"),
            reporting_component="weight-controller",
            reporting_instance=self._settings.leader_election.identity or "weight-controller",
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            await self._call(
                f"create event in {target.namespace}",
                lambda: self._core.create_namespaced_event(target.namespace, body),
            )
        except APIError as exc:  # an Event is a courtesy; the weights are already written
            self._count(exc)
            log.warning("could not emit event", target=target.key, error=str(exc))

    def _forget(self, target: Target) -> None:
        log.info("target deleted; forgetting it", target=target.key)
        self._targets.pop(target.key, None)

    def _count(self, exc: APIError) -> None:
        self._metrics.api_errors.labels(exc.reason).inc()

    async def _call(self, doing: str, request: Callable[[], Awaitable[T]]) -> T:
        try:
            async with asyncio.timeout(self._kube.api_timeout):
                return await request()
        except API_EXCEPTIONS as exc:
            raise translate(exc, doing) from exc


def _gvp(target: Target) -> tuple[str, str, str]:
    return objects.HTTPROUTE if target.kind == "HTTPRoute" else objects.EXTERNAL_MODEL


def _resource(target: Target) -> str:
    group, _, plural = _gvp(target)
    return f"{plural}.{group}"


def _fmt(values: Mapping[str, int]) -> str:
    return " ".join(f"{n}={w}" for n, w in sorted(values.items()))
