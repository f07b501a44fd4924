"""Reads the routing targets from Kubernetes and writes the weights the loop decided, safely.

Every tick ``discover`` lists the opted-in ExternalModels and their ExternalProviders (each
object parsed again only when its resourceVersion changed) and reads the configured HTTPRoutes
(one target per rule). ``write`` patches one target, on the leader only:

- a JSON Patch whose ``test`` ops pin each ref's name at its index (a reordered list gets a 422,
  never wrong weights); on 409/422 the object is read afresh and handed back as a conflict, so
  the loop decides again from what it holds now;
- 404: the target is gone, forget it; 403: refused, with a log line naming the verb to grant;
- the applied weights and time go into the ``last-applied`` annotation, and an Event is emitted;
- a weight someone else changed is logged with who changed it (from managedFields).

Nothing here decides weights: that is ``controller.weights.weigh``, called by the loop. In a
dry run nothing is sent but GETs and LISTs: ``write`` answers what would be applied.

When the API server is unreachable the known targets are kept, so weights are still decided and
exported as desired, and the latest decision is written once the API answers again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

import structlog

from controller import addresses
from controller.exporter import ControllerMetrics
from controller.kube import objects
from controller.kube.errors import (
    API_EXCEPTIONS,
    APIConflictError,
    APIError,
    APIForbiddenError,
    APIInvalidError,
    APINotFoundError,
    APISchemaError,
    APIServerError,
    APIUnavailableError,
    translate,
)
from controller.kube.objects import ProviderMapping
from controller.kube.sdk import client
from controller.logs import Conditions
from controller.model import Target, Write, WriteResult
from controller.publish import Discovery
from controller.settings import ClusterSettings, HTTPRouteTarget, Settings

log = structlog.get_logger("controller.publish")
T = TypeVar("T")


@dataclass(slots=True)
class _Cache:
    """Parsed targets by uid, reused while the resourceVersion (and the mapping) is unchanged."""

    parsed: dict[str, tuple[tuple[str, int], ProviderMapping, Target]] = field(default_factory=dict)

    def get(self, obj: Mapping[str, Any], mapping: ProviderMapping, minimum: int) -> Target:
        meta = obj.get("metadata", {})
        uid = str(meta.get("uid", ""))
        version = (str(meta.get("resourceVersion", "")), minimum)
        hit = self.parsed.get(uid)
        if hit is not None and hit[0] == version and hit[1] == mapping:
            return hit[2]
        target = objects.external_model(obj, mapping, minimum)
        self.parsed[uid] = (version, mapping, target)
        return target


class KubernetesPublisher:
    def __init__(
        self,
        settings: Settings,
        api: client.ApiClient,
        metrics: ControllerMetrics,
        is_leader: Callable[[float], bool] = lambda margin: True,
        dry_run: bool = False,
    ) -> None:
        self._settings = settings
        self._kube = settings.kubernetes
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._metrics = metrics
        self._is_leader = is_leader
        self._dry_run = dry_run
        self._targets: dict[str, Target] = {}
        self._defined: list[ClusterSettings] = []
        self._cache = _Cache()
        self._configured = {c.name for c in settings.clusters}
        self._routes = {(r.namespace, r.name): r for r in self._kube.httproutes}
        # Provider mappings from the last discovery, reused when a written or re-read object
        # is parsed again in the same tick (instead of listing the providers once per write).
        self._mappings: dict[str, ProviderMapping] = {}
        # Problems found while reading targets persist across ticks: one line when one starts,
        # one when it ends (see logs.Conditions), not one per tick.
        self._conditions = Conditions(log, settings.log.repeat_interval)
        self._seen: set[tuple[str, ...]] = set()
        self._minimum: int | None = None  # the ExternalModel CRD's lowest weight, once known
        self._refused: dict[str, str] = {}  # objects we will not write, and why
        ours = urlsplit(api.configuration.host or "")
        port = ours.port or (443 if ours.scheme == "https" else 80)
        where = f"{(ours.hostname or '').lower()}:{port}"
        self._api_hosts = addresses.api_server_hosts([where])
        self._last_refused: dict[str, str] = {}

    @property
    def targets(self) -> Mapping[str, Target]:
        return self._targets

    # ---- discovery ---------------------------------------------------------------------------
    async def discover(self) -> Discovery:
        """Refresh the targets and the clusters ExternalProviders define by annotation."""
        self._seen = set()
        self._refused = {}
        try:
            targets, defined = await self._read_targets()
        except APIError as exc:
            self._count(exc)
            self._conditions.observe(
                "cannot read targets",
                ("api",),
                reason=exc.reason,
                error=str(exc),
                kept_targets=len(self._targets),
            )
            return Discovery(
                tuple(self._targets.values()), self._defined, self._last_refused, False, str(exc)
            )
        self._last_refused = dict(self._refused)
        self._conditions.clear(("api",))
        self._conditions.retain(("discovery",), set(self._seen))
        self._targets = {t.key: t for t in targets}
        self._defined = defined
        self._cache.parsed = {t.uid: v for t in targets if (v := self._cache.parsed.get(t.uid))}
        return Discovery(tuple(targets), defined, self._last_refused, True)

    async def weight_minimum(self) -> int:
        """The lowest weight an ExternalModel ref accepts: the setting, else the installed
        CRD's ``minimum`` (MaaS v0.2.0 rejects 0 with a 422), else 1, which every version
        accepts. Read once; an unreachable API server is asked again next time."""
        if self._minimum is not None:
            return self._minimum
        setting = self._kube.min_weight
        if setting != "auto":
            self._minimum = setting
            log.info("weight minimum", minimum=setting, source="setting")
            return setting
        try:
            crd = await self._call(
                f"get customresourcedefinitions {objects.EXTERNAL_MODEL_CRD}",
                lambda: self._custom.get_cluster_custom_object(
                    "apiextensions.k8s.io",
                    "v1",
                    "customresourcedefinitions",
                    objects.EXTERNAL_MODEL_CRD,
                ),
            )
            self._minimum = objects.weight_minimum(crd)
        except (APIUnavailableError, APIServerError) as exc:
            self._count(exc)
            return 1  # for now; the CRD is read again on the next discovery
        except (APIError, KeyError, ValueError, TypeError, AttributeError) as exc:
            if isinstance(exc, APIError):
                self._count(exc)
            self._minimum = 1
            log.info("weight minimum", minimum=1, source="assumed", error=str(exc))
            return 1
        log.info("weight minimum", minimum=self._minimum, source="crd")
        return self._minimum

    async def _read_targets(self) -> tuple[list[Target], list[ClusterSettings]]:
        targets: list[Target] = []
        defined: list[ClusterSettings] = []
        minimum = await self.weight_minimum()
        for namespace, models in (await self._models()).items():
            mapping = self._mappings[namespace]
            defined += mapping.defined
            for obj in models:
                model = self._cache.get(obj, mapping, minimum)
                if len(model.refs) >= 2 and self._usable(model):
                    targets.append(model)
        for route in self._routes.values():
            for rule in await self._read_httproute(route):
                if len(rule.refs) >= 2 and self._usable(rule):
                    targets.append(rule)
        return targets, defined

    async def _models(self) -> dict[str, list[dict[str, Any]]]:
        """Opted-in ExternalModels by namespace, with each namespace's provider mapping read.

        No namespaces configured (the default): one LIST of each kind across the cluster —
        MaaS puts ExternalModels in model namespaces (e.g. ``llm``), not in ours. Otherwise two
        LISTs per configured namespace, which namespaced Roles can grant."""
        if self._kube.namespaces:
            found = {}
            for namespace in self._kube.namespaces:
                self._mappings[namespace] = await self._providers(namespace)
                found[namespace] = await self._list(objects.EXTERNAL_MODEL, namespace, True)
            return found
        providers = _by_namespace(await self._list(objects.EXTERNAL_PROVIDER, None, False))
        models = _by_namespace(await self._list(objects.EXTERNAL_MODEL, None, True))
        for namespace in models:
            self._mappings[namespace] = self._mapping(providers.get(namespace, []))
        return models

    async def _list(
        self, gvp: tuple[str, str, str], namespace: str | None, selected: bool
    ) -> list[dict[str, Any]]:
        group, version, plural = gvp
        selector = self._kube.label_selector if selected else ""  # "": every object
        if namespace is None:
            found = await self._call(
                f"list {plural} in all namespaces",
                lambda: self._custom.list_cluster_custom_object(
                    group, version, plural, label_selector=selector
                ),
            )
        else:
            found = await self._call(
                f"list {plural} in {namespace}",
                lambda: self._custom.list_namespaced_custom_object(
                    group, version, namespace, plural, label_selector=selector
                ),
            )
        return list(found.get("items", []))

    async def _providers(self, namespace: str) -> ProviderMapping:
        return self._mapping(await self._list(objects.EXTERNAL_PROVIDER, namespace, False))

    def _mapping(self, providers: list[dict[str, Any]]) -> ProviderMapping:
        mapping = objects.map_providers(providers, self._configured, self._refuse)
        for problem in mapping.problems:
            self._problem("ignoring provider annotations", ("provider", problem), problem=problem)
        return mapping

    def _refuse(self, url: str) -> str | None:
        return addresses.refusal(url, self._kube.annotation_urls, self._api_hosts)

    def _problem(self, event: str, key: tuple[str, ...], **fields: Any) -> None:
        """A problem with the objects read in this discovery; it ends when one no longer has it."""
        full = ("discovery", *key)
        self._seen.add(full)
        self._conditions.observe(event, full, **fields)

    async def _read_httproute(self, config: HTTPRouteTarget) -> list[Target]:
        namespace, name = config.namespace, config.name
        try:
            obj = await self._call(
                f"get httproutes {namespace}/{name}",
                lambda: self._custom.get_namespaced_custom_object(
                    *objects.HTTPROUTE[:2], namespace, objects.HTTPROUTE[2], name
                ),
            )
        except APINotFoundError:
            self._problem(
                "configured HTTPRoute not found",
                ("route", namespace, name),
                route=f"{namespace}/{name}",
            )
            return []
        owner = objects.controller_owner(obj)
        if owner is not None:
            # e.g. the payload processor's route for an ExternalModel: it rewrites the spec
            # from its own object, so weights written here would be undone (steer the
            # ExternalModel instead).
            why = f"owned by {owner}, which rewrites its spec"
            self._refused[f"HTTPRoute/{namespace}/{name}"] = why
            self._problem(
                "route refused: owned by another controller",
                ("owned", namespace, name),
                route=f"{namespace}/{name}",
                owner=owner,
            )
            return []
        return objects.httproute(obj, config)

    def _usable(self, target: Target) -> bool:
        names = [ref.name for ref in target.refs]
        if len(set(names)) != len(names):
            self._problem(
                "target skipped: a ref name appears twice", ("dup", target.key), target=target.key
            )
            return False
        for ref in target.refs:
            if ref.cluster is None:
                self._problem(
                    "ref unmapped",
                    ("unmapped", target.key, ref.name),
                    target=target.key,
                    ref=ref.name,
                    weight=ref.weight,
                )
        return True

    # ---- writing ------------------------------------------------------------------------------
    async def write(self, target: Target, desired: Mapping[str, int], why: str) -> WriteResult:
        """Patch ``target`` to hold ``desired``. Leadership is checked before every attempt."""
        if self._dry_run:
            return WriteResult(Write.WOULD, target.holding(desired))
        # Leadership is checked before every attempt (a retry after a conflict included), with
        # a whole API timeout of the lease left: no patch may land after the fence.
        if not self._is_leader(self._kube.api_timeout):
            return WriteResult(Write.FOLLOWER, target)
        try:
            return WriteResult(Write.DONE, await self._patch(target, desired, why))
        except APISchemaError as exc:  # the same body would be refused again: no retry
            self._count(exc)
            for cause in exc.causes:
                self._metrics.schema_rejections.labels(target.key, cause.get("field", "")).inc()
            return WriteResult(Write.REFUSED, target, exc.fields, exc.reason)
        except (APIConflictError, APIInvalidError) as exc:
            self._count(exc)
            log.info("write conflict", target=target.key, reason=exc.reason, error=str(exc))
            return await self._reread(target)
        except APINotFoundError:
            self._forget(target)
            return WriteResult(Write.GONE)
        except APIForbiddenError as exc:
            self._count(exc)
            fix = f"grant verb 'patch' on {_resource(target)} in {target.namespace}"
            return WriteResult(Write.REFUSED, target, f"{exc}; {fix}", exc.reason)
        except APIError as exc:
            self._count(exc)
            return WriteResult(Write.FAILED, target, str(exc), exc.reason)

    async def _reread(self, target: Target) -> WriteResult:
        """After a conflict: the object as it is now (``CONFLICT``), or why there is none."""
        group, version, plural = _gvp(target)
        try:
            obj = await self._call(
                f"get {plural} {target.namespace}/{target.name}",
                lambda: self._custom.get_namespaced_custom_object(
                    group, version, target.namespace, plural, target.name
                ),
            )
            fresh = await self._parse(obj, target)
        except APINotFoundError:
            fresh = None
        except APIError as exc:
            self._count(exc)
            return WriteResult(Write.FAILED, target, f"re-read after a conflict: {exc}", exc.reason)
        if fresh is None:
            self._forget(target)
            return WriteResult(Write.GONE)
        self._targets[fresh.key] = fresh
        return WriteResult(Write.CONFLICT, fresh)

    async def _parse(self, obj: Mapping[str, Any], like: Target) -> Target | None:
        """``like`` as read from ``obj`` again (``None``: that rule or ref list is gone)."""
        if like.kind == "HTTPRoute":
            rules = objects.httproute(obj, self._routes[(like.namespace, like.name)])
            return next((rule for rule in rules if rule.key == like.key), None)
        mapping = self._mappings.get(like.namespace) or await self._providers(like.namespace)
        return objects.external_model(obj, mapping, like.minimum)

    async def _patch(self, target: Target, desired: Mapping[str, int], why: str) -> Target:
        self._note_foreign_change(target, desired)
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
        written = await self._parse(obj, target) or target.holding(desired)
        await self._event(target, f"Weights changed ({why})")
        self._targets[target.key] = written
        return written

    def _note_foreign_change(self, target: Target, desired: Mapping[str, int]) -> None:
        current = {ref.name: ref.weight for ref in target.refs if ref.name in desired}
        ours = target.last_applied
        if ours is not None and dict(ours) != dict(current):
            log.warning(
                "replacing weights changed outside the controller",
                target=target.key,
                changed_by=objects.last_writer(target.writers, self._kube.field_manager),
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
        log.info("target gone", target=target.key)
        self._targets.pop(target.key, None)

    def _count(self, exc: APIError) -> None:
        self._metrics.api_errors.labels(exc.reason).inc()

    async def _call(self, doing: str, request: Callable[[], Awaitable[T]]) -> T:
        try:
            async with asyncio.timeout(self._kube.api_timeout):
                return await request()
        except API_EXCEPTIONS as exc:
            raise translate(exc, doing) from exc


def _by_namespace(items: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        grouped.setdefault(str(item.get("metadata", {}).get("namespace", "")), []).append(item)
    return grouped


def _gvp(target: Target) -> tuple[str, str, str]:
    return objects.HTTPROUTE if target.kind == "HTTPRoute" else objects.EXTERNAL_MODEL


def _resource(target: Target) -> str:
    group, _, plural = _gvp(target)
    return f"{plural}.{group}"


def _fmt(values: Mapping[str, int]) -> str:
    return " ".join(f"{n}={w}" for n, w in sorted(values.items()))
