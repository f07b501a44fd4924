"""Finds the routing targets in Kubernetes; writing them is ``controller.publish.kubernetes``.

Every tick ``discover`` lists the opted-in ExternalModels and their ExternalProviders (each
object parsed again only when its resourceVersion changed) and reads the configured HTTPRoutes
(one target per rule). It also says which clusters ExternalProviders define by annotation, and
which objects it will not write and why. When the API server is unreachable the known targets
are kept, so weights are still decided and exported, and written once the API answers again.
Problems with the objects read persist across ticks as conditions: one line when one starts,
one when it ends (``conditions.Conditions``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import structlog

from controller import addresses
from controller.conditions import Conditions
from controller.kube import objects
from controller.kube.errors import (
    APIError,
    APIGate,
    APINotFoundError,
    APIServerError,
    APIThrottledError,
    APIUnavailableError,
    call,
)
from controller.kube.informer import Informer, Lister
from controller.kube.objects import ProviderMapping
from controller.kube.sdk import client
from controller.metrics import ControllerMetrics
from controller.model import Target
from controller.settings import ClusterSettings, HTTPRouteTarget, Settings

log = structlog.get_logger("controller.discovery")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Discovery:
    """What discovery found: the targets to weigh, the clusters that objects define beyond the
    configured ones (by annotations), the objects it will not write and why, and whether the
    Kubernetes API could be read this time (``None``: no Kubernetes) and if not, why."""

    targets: Sequence[Target] = ()
    clusters: Sequence[ClusterSettings] = field(default=())
    refused: Mapping[str, str] = field(default_factory=dict)
    reachable: bool | None = None
    error: str | None = None


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


# Discoveries in a row a scope (a namespace, a route) may be unreadable by its own fault and
# keep its targets as last read: a blip rides through; a namespace gone with our RoleBinding
# is dropped after this many (a minute at the default interval).
KEPT_UNREAD = 6


class TargetDiscovery:
    def __init__(
        self,
        settings: Settings,
        api: client.ApiClient,
        metrics: ControllerMetrics,
        tenants: addresses.TenantAddresses | None = None,
    ):
        self._kube = settings.kubernetes
        self._custom = client.CustomObjectsApi(api)
        self._metrics = metrics
        self._targets: dict[str, Target] = {}
        self._defined: list[ClusterSettings] = []
        self._cache = _Cache()
        self.gate = APIGate()  # one API server's throttle, shared with the publisher
        self._lister = Lister(
            self._custom,
            self._kube.api_timeout,
            self._kube.watch,
            self.gate,
            self._kube.watch_idle,
        )
        self._configured = {c.name for c in settings.clusters}
        self.routes = {(r.namespace, r.name): r for r in self._kube.httproutes}
        # Provider mappings from the last discovery, reused when a written or re-read object
        # is parsed again in the same tick (instead of listing the providers once per write).
        self._mappings: dict[str, ProviderMapping] = {}
        # each namespace's mapping and the providers' versions it was made from (_mapping)
        self._provider_maps: dict[
            str, tuple[tuple[tuple[str, str], ...] | None, ProviderMapping]
        ] = {}
        self._conditions = Conditions(log, settings.log.repeat_interval)
        self._seen: set[tuple[str, ...]] = set()
        self._minimum: int | None = None  # the ExternalModel CRD's lowest weight, once known
        # scopes (a namespace, a route) the API refused to give, and for how many discoveries
        # in a row; and this discovery's, with why (``_unreadable``)
        self._unread: dict[str, int] = {}
        self._unreadable_now: dict[str, str] = {}
        self._refused: dict[str, str] = {}  # objects we will not write, and why
        self._last_refused: dict[str, str] = {}
        ours = urlsplit(api.configuration.host or "")
        port = ours.port or (443 if ours.scheme == "https" else 80)
        self._api_hosts = addresses.api_server_hosts([f"{(ours.hostname or '').lower()}:{port}"])
        # where the clusters annotations define may be dialled, checked once resolved
        self.tenants = tenants or addresses.TenantAddresses(self._kube.annotation_urls)
        self.tenants.api_hosts = self._api_hosts

    @property
    def targets(self) -> Mapping[str, Target]:
        return self._targets

    async def discover(self) -> Discovery:
        """Refresh the targets and the clusters ExternalProviders define by annotation."""
        self._seen = set()
        self._refused = {}
        self._unreadable_now = {}
        try:
            targets, defined = await self._read_targets()
        except APIError as exc:
            self.count(exc)
            self._conditions.observe(
                "cannot read targets",
                ("api",),
                reason=exc.reason,
                error=str(exc),
                kept_targets=len(self._targets),
            )
            known = tuple(self._targets.values())
            return Discovery(known, self._defined, self._last_refused, False, str(exc))
        if not targets:
            self._problem(
                "no target opted in",
                ("none",),
                label_selector=self._kube.label_selector,
                namespaces=self._kube.namespaces or "all",
                httproutes=len(self.routes),
            )
        self._last_refused = dict(self._refused)
        self._conditions.clear(("api",))
        self._conditions.retain(("discovery",), set(self._seen))
        self._targets = {t.key: t for t in targets}
        self._defined = defined
        self._cache.parsed = {t.uid: v for t in targets if (v := self._cache.parsed.get(t.uid))}
        partly = "; ".join(f"{scope}: {why}" for scope, why in self._unreadable_now.items())
        return Discovery(tuple(targets), defined, self._last_refused, True, partly or None)

    def remember(self, target: Target) -> None:
        """``target`` as it is now (after a write or a re-read)."""
        self._targets[target.key] = target

    def forget(self, target: Target) -> None:
        log.info("target gone", target=target.key)
        self._targets.pop(target.key, None)

    async def parse(self, obj: Mapping[str, Any], like: Target) -> Target | None:
        """``like`` as read from ``obj`` again (``None``: that rule or ref list is gone)."""
        if like.kind == "HTTPRoute":
            rules = objects.httproute(obj, self.routes[(like.namespace, like.name)])
            return next((rule for rule in rules if rule.key == like.key), None)
        mapping = self._mappings.get(like.namespace) or await self._providers(like.namespace)
        return objects.external_model(obj, mapping, like.minimum)

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
        except (APIUnavailableError, APIServerError, APIThrottledError) as exc:
            self.count(exc)
            return 1  # for now; the CRD is read again on the next discovery
        except (APIError, KeyError, ValueError, TypeError, AttributeError) as exc:
            if isinstance(exc, APIError):
                self.count(exc)
            self._minimum = 1
            log.info("weight minimum", minimum=1, source="assumed", error=str(exc))
            return 1
        log.info("weight minimum", minimum=self._minimum, source="crd")
        return self._minimum

    def minimum_refused(self) -> None:
        """The schema refused a weight: the CRD is read again at the next discovery (MaaS
        rolled back to a CRD whose minimum is 1, and a dead cluster's 0 was refused for
        good, its traffic kept until a restart: an attack). A configured minimum stays."""
        if self._kube.min_weight == "auto":
            self._minimum = None

    def count(self, exc: APIError) -> None:
        self._metrics.api_errors.labels(exc.reason).inc()

    # ---- reading -----------------------------------------------------------------------------
    async def _read_targets(self) -> tuple[list[Target], list[ClusterSettings]]:
        targets: list[Target] = []
        defined: list[ClusterSettings] = []
        minimum = await self.weight_minimum()
        models, unread = await self._models()
        for namespace, found in models.items():
            mapping = self._mappings[namespace]
            defined += mapping.defined
            for obj in found:
                model = self._parsed(obj, mapping, minimum)
                if model is not None and len(model.refs) >= 2 and self._usable(model):
                    targets.append(model)
        for namespace in unread:  # as the last discovery left them
            targets += self._kept("ExternalModel", namespace)
            if namespace in self._mappings:
                defined += self._mappings[namespace].defined
        for route in self.routes.values():
            for rule in await self._read_httproute(route):
                if len(rule.refs) >= 2 and self._usable(rule):
                    targets.append(rule)
        return targets, defined

    def _kept(self, kind: str, namespace: str, name: str | None = None) -> list[Target]:
        """The known targets of a scope that could not be read now (a namespace's
        ExternalModels, a route's rules)."""
        return [
            t
            for t in self._targets.values()
            if (t.kind, t.namespace) == (kind, namespace) and name in (None, t.name)
        ]

    def _unreadable(
        self, event: str, key: tuple[str, ...], exc: APIError, kept: int, **where: str
    ) -> bool:
        """One scope (a namespace, a route) the API would not give, by its own fault (403,
        404, 5xx): named, and in ``Discovery.error``; its targets kept for ``KEPT_UNREAD``
        discoveries in a row, then dropped (a namespace deleted with our RoleBinding was
        kept, frozen and alerting, for good: a review). A tenant's RoleBinding deleted or its
        route's 500 stopped every other tenant's discovery (found by an attack). A server
        that does not answer (a timeout, refused, throttled) is every scope's: raised, as
        before (a review: a hung server cost an api_timeout a namespace). Whether to keep
        the scope's targets."""
        if isinstance(exc, APIUnavailableError | APIThrottledError):
            raise exc
        self.count(exc)
        scope = _scope(key)
        self._unread[scope] = misses = self._unread.get(scope, 0) + 1
        keep = misses <= KEPT_UNREAD
        self._unreadable_now[scope] = f"{exc.reason} ({'kept' if keep else 'dropped'})"
        kept = kept if keep else 0
        self._problem(event, key, reason=exc.reason, error=str(exc), kept_targets=kept, **where)
        return keep

    async def _models(self) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
        """Opted-in ExternalModels by namespace, with each namespace's provider mapping read,
        and the configured namespaces that could not be read by their own fault (each named,
        its targets kept for a while: ``_unreadable``).

        No namespaces configured (the default): one LIST of each kind across the cluster —
        MaaS puts ExternalModels in model namespaces (e.g. ``llm``), not in ours. Otherwise two
        LISTs per configured namespace, which namespaced Roles can grant."""
        if self._kube.namespaces:
            found: dict[str, list[dict[str, Any]]] = {}
            unread: list[str] = []
            for namespace in self._kube.namespaces:
                try:
                    mapping = await self._providers(namespace)
                    found[namespace] = await self._list(objects.EXTERNAL_MODEL, namespace, True)
                except APIError as exc:
                    kept = len(self._kept("ExternalModel", namespace))
                    key = ("namespace", namespace)
                    if self._unreadable(
                        "cannot read namespace", key, exc, kept, namespace=namespace
                    ):
                        unread.append(namespace)
                    continue
                self._unread.pop(_scope(("namespace", namespace)), None)
                self._mappings[namespace] = mapping
            # every namespace refusing by its own fault (403: a one-namespace config whose
            # RoleBinding went) is still that: kept, then dropped (a review: raised, it was
            # kept for good); a server that does not answer was raised by _unreadable
            return found, unread
        providers = _by_namespace(await self._list(objects.EXTERNAL_PROVIDER, None, False))
        models = _by_namespace(await self._list(objects.EXTERNAL_MODEL, None, True))
        for namespace in models:
            self._mappings[namespace] = self._mapping(namespace, providers.get(namespace, []))
        return models, []

    async def _list(
        self, gvp: tuple[str, str, str], namespace: str | None, selected: bool
    ) -> list[dict[str, Any]]:
        selector = self._kube.label_selector if selected else ""  # "": every object
        return await self._lister.list(gvp, namespace, selector)

    @property
    def informers(self) -> list[Informer]:
        """The watches discovery reads (``kubernetes.watch``), one per kind and scope."""
        return self._lister.informers

    async def close(self) -> None:
        await self._lister.close()

    async def _providers(self, namespace: str) -> ProviderMapping:
        found = await self._list(objects.EXTERNAL_PROVIDER, namespace, False)
        return self._mapping(namespace, found)

    def _mapping(self, namespace: str, providers: list[dict[str, Any]]) -> ProviderMapping:
        """A namespace's providers mapped to clusters: again only when one of them changed
        (by uid and resourceVersion, as ExternalModels are parsed). 2,000 annotated
        providers mapped every tick cost 0.75-1.2 s of the event loop (found by an attack)."""
        versions = [_version(p) for p in providers]
        key = tuple(sorted(versions)) if all(v[1] for v in versions) else None
        known = self._provider_maps.get(namespace)
        if key is not None and known is not None and known[0] == key:
            mapping = known[1]
        else:
            urls = self._kube.annotation_urls
            mapping = objects.map_providers(
                providers,
                self._configured,
                self._refuse,
                urls.tokens,
                urls.max_urls,
                urls.max_clusters,
            )
            self._provider_maps[namespace] = (key, mapping)
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
        except APIError as exc:  # the LISTs before it were answered: this route's own
            kept = self._kept("HTTPRoute", namespace, name)
            key, route = ("route", f"{namespace}/{name}"), f"{namespace}/{name}"
            keeping = self._unreadable("cannot read HTTPRoute", key, exc, len(kept), route=route)
            return kept if keeping else []
        self._unread.pop(_scope(("route", f"{namespace}/{name}")), None)
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

    def _parsed(
        self, obj: Mapping[str, Any], mapping: ProviderMapping, minimum: int
    ) -> Target | None:
        """One ExternalModel as a target; one that cannot be read is refused, by name, and
        the others are read on (a bad object never leaves its own entry)."""
        try:
            return self._cache.get(obj, mapping, minimum)
        except Exception as exc:  # anything in an object anyone can write
            found = obj.get("metadata")
            meta: Mapping[str, Any] = found if isinstance(found, dict) else {}
            key = f"ExternalModel/{meta.get('namespace', '?')}/{meta.get('name', '?')}"
            why = f"unreadable: {type(exc).__name__}"
            self._refused[key] = why
            self._problem("object refused: unreadable", ("unreadable", key), target=key, why=why)
            return None

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

    async def _call(self, doing: str, request: Callable[[], Awaitable[T]]) -> T:
        return await call(doing, request, self._kube.api_timeout, self.gate)


def _by_namespace(items: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        grouped.setdefault(str(item.get("metadata", {}).get("namespace", "")), []).append(item)
    return grouped


def _version(obj: Mapping[str, Any]) -> tuple[str, str]:
    found = obj.get("metadata")
    meta: Mapping[str, Any] = found if isinstance(found, dict) else {}
    return str(meta.get("uid", "")), str(meta.get("resourceVersion", ""))


def _scope(key: tuple[str, ...]) -> str:
    """A scope's name as ``Discovery.error`` shows it: "namespace team-b", "route apps/llama"."""
    return " ".join(key)
