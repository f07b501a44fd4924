"""Writes the weights the loop decided to Kubernetes objects, safely, on the leader only.

The targets come from ``controller.kube.discovery`` (``discover`` hands them on). ``write``:

- a JSON Patch whose ``test`` ops pin each ref's name at its index and the weight it was read
  with (a reordered list or a hand edit gets a 422, never wrong weights or a blind overwrite);
  on 409/422 the object is read afresh (a changed weight is logged with who changed it) and
  handed back as a conflict, so the loop decides again from what it holds now;
- a 429 closes the API for its ``Retry-After`` (``kubernetes.errors.APIGate``);
- 404: the target is gone, forget it; 403: refused, with a detail naming the verb to grant;
- the applied weights and time go into the ``last-applied`` annotation; an Event is emitted when
  the way the weights are decided changes (the mode: ``normal``, ``saturated``, …), or at
  most every ``EVENT_EVERY`` seconds while it stays, saying how many writes it stands for: a
  target stepping every tick does not become an Event every tick;
- a weight someone else changed is logged with who changed it (from managedFields).

Nothing here decides weights: that is ``controller.weights.weigh``, called by the loop. A dry
run wraps this publisher in ``publish.dryrun.DryRun`` and never reaches ``write``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import structlog

from controller.addresses import TenantAddresses
from controller.conditions import Conditions
from controller.kube import objects
from controller.kube.discovery import Discovery, TargetDiscovery
from controller.kube.errors import (
    APIConflictError,
    APIError,
    APIForbiddenError,
    APIInvalidError,
    APINotFoundError,
    APISchemaError,
    APITimeoutError,
    call,
)
from controller.kube.sdk import client
from controller.metrics import ControllerMetrics
from controller.model import Target, Write, WriteResult
from controller.publish import MAY_HAVE_LANDED
from controller.settings import Settings

log = structlog.get_logger("controller.publish")
REFUSAL_EVENTS = 10  # Warning Events for newly refused objects, at most, per tick
EVENT_EVERY = 600.0  # a WeightsChanged Event for the same mode at most this often
# Writes over one object in a row before the version the watch shows comes back from them
# (``_Written``): past this many, it has stopped telling (a watch stalled for good): start afresh.
WRITES_IN_A_ROW = 64


@dataclass(slots=True)
class _Written:
    """Our latest write to one object: the versions our writes in a row moved it from
    (what a watch behind them may still show, or a rule of an HTTPRoute read before them),
    and the object the last of them left."""

    over: set[str]
    obj: Mapping[str, Any]


T = TypeVar("T")


class KubernetesPublisher:
    def __init__(
        self,
        settings: Settings,
        api: client.ApiClient,
        metrics: ControllerMetrics,
        is_leader: Callable[[float], bool] = lambda margin: True,
        discovery: TargetDiscovery | None = None,
        tenants: TenantAddresses | None = None,
    ) -> None:
        self._settings = settings
        self._kube = settings.kubernetes
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._metrics = metrics
        self._is_leader = is_leader
        self.discovery = discovery or TargetDiscovery(settings, api, metrics, tenants)
        self._warned: set[tuple[str, str]] = set()  # refused objects told by an Event
        # per target: the mode of its last Event, when it went out, writes since
        self._told: dict[str, tuple[str, float, int]] = {}
        self._clock = time.monotonic
        # a tug-of-war (GitOps, another controller) rewriting the weights we write: one line
        # when it starts, every log.repeat_interval while it lasts, one when it ends
        self._conditions = Conditions(log, settings.log.repeat_interval)
        self._foreign: dict[str, tuple[str, str, str, str]] = {}  # per target: its condition
        # Our latest write to each object (``_Written``): another rule of an HTTPRoute read
        # before it is written from what it left, not refused as changed since; and a watch
        # that lags (still showing a version we wrote over, for ticks) is read as what we
        # wrote, not weighed from the weights before it with every patch refused and blamed
        # on someone else (found by an attack). One object each, dropped once the watch
        # shows another version (a review: an object kept per write held 426 MiB).
        self._written: dict[tuple[str, str, str], _Written] = {}
        # The rules of one HTTPRoute are written one after another (the loop writes targets
        # in parallel): each sees what the one before left.
        self._objects: dict[tuple[str, str, str], asyncio.Lock] = {}

    async def discover(self) -> Discovery:
        """The targets; an object newly refused (unreadable, owned by another controller) is
        told by a Warning Event on it, once while it stays refused, by the leader only."""
        self._objects = {}
        found = await self.discovery.discover()
        if self._written:  # what a lagging watch still shows as it was before our write
            behind = [await self._after_own_writes(t) for t in found.targets]
            shown = {_object(t): t.resource_version for t in found.targets}
            for gone in [k for k, w in self._written.items() if shown.get(k) not in w.over]:
                del self._written[gone]  # caught up, changed by someone, or not ours now
            found = replace(found, targets=tuple(behind))
        refused = {(key, why) for key, why in found.refused.items()}
        if self._is_leader(self._kube.api_timeout):
            for key, why in sorted(refused - self._warned)[:REFUSAL_EVENTS]:
                kind, _, rest = key.partition("/")
                namespace, _, name = rest.partition("/")
                if namespace and name:
                    await self._event_on(kind, namespace, name, "", "Refused", why, "Warning")
                self._warned.add((key, why))
        self._warned &= refused
        return found

    async def write(self, target: Target, desired: Mapping[str, int], why: str) -> WriteResult:
        """Patch ``target`` to hold ``desired``. Leadership is checked before every attempt."""
        # Leadership is checked before every attempt (a retry after a conflict included), with
        # a whole API timeout of the lease left: no patch may land after the fence.
        if not self._is_leader(self._kube.api_timeout):
            return WriteResult(Write.FOLLOWER, target)
        try:
            async with self._objects.setdefault(_object(target), asyncio.Lock()):
                # again once the object is ours: another rule's patch and Event may each have
                # taken up to an API timeout meanwhile (an attack saw a rule land seconds
                # after the fence, past a follower's takeover)
                if not self._is_leader(self._kube.api_timeout):
                    return WriteResult(Write.FOLLOWER, target)
                return WriteResult(Write.DONE, await self._patch(target, desired, why))
        except APISchemaError as exc:  # the same body would be refused again: no retry
            self.discovery.count(exc)
            if any(c.get("field", "").endswith(".weight") for c in exc.causes):
                self.discovery.minimum_refused()
            for cause in exc.causes:
                self._metrics.schema_rejections.labels(target.key, cause.get("field", "")).inc()
            return WriteResult(Write.REFUSED, target, exc.fields, exc.reason)
        except (APIConflictError, APIInvalidError) as exc:
            self.discovery.count(exc)
            log.info("write conflict", target=target.key, reason=exc.reason, error=str(exc))
            return await self._reread(target)
        except APINotFoundError:
            self.discovery.forget(target)
            return WriteResult(Write.GONE)
        except APIForbiddenError as exc:
            self.discovery.count(exc)
            fix = f"grant verb 'patch' on {_resource(target)} in {target.namespace}"
            return WriteResult(Write.REFUSED, target, f"{exc}; {fix}", exc.reason)
        except APIError as exc:
            self.discovery.count(exc)
            detail = str(exc)
            if isinstance(exc, APITimeoutError):  # sent, never answered: it may have landed
                detail += f"; the patch may have landed: {MAY_HAVE_LANDED}"
            return WriteResult(Write.FAILED, target, detail, exc.reason)

    async def _reread(self, target: Target) -> WriteResult:
        """After a conflict: the object as it is now (``CONFLICT``), or why there is none (an
        ExternalModel no longer opted in is gone for us: read through the label selector, as
        discovery lists it, and never written again from a watch that lags)."""
        try:
            obj = await self._fresh(target)
            fresh = await self.discovery.parse(obj, target) if obj is not None else None
        except APINotFoundError:
            fresh = None
        except APIError as exc:
            self.discovery.count(exc)
            return WriteResult(Write.FAILED, target, f"re-read after a conflict: {exc}", exc.reason)
        if fresh is None:
            self.discovery.forget(target)
            return WriteResult(Write.GONE)
        if fresh.weights != target.weights:  # a hand edit since the read: told, not lost
            log.warning(
                "weights changed since they were read",
                target=target.key,
                changed_by=objects.last_writer(fresh.writers, self._kube.field_manager),
                read=_fmt(target.weights),
                now=_fmt(fresh.weights),
            )
        self.discovery.remember(fresh)
        return WriteResult(Write.CONFLICT, fresh)

    async def _fresh(self, target: Target) -> Mapping[str, Any] | None:
        """``target``'s object as the API server holds it now; an ExternalModel only while
        ``kubernetes.label_selector`` still selects it (the server judges the selector)."""
        group, version, plural = _gvp(target)
        where = f"{target.namespace}/{target.name}"
        if target.kind == "HTTPRoute":  # configured by name, not opted in by label
            return await self._call(
                f"get {plural} {where}",
                lambda: self._custom.get_namespaced_custom_object(
                    group, version, target.namespace, plural, target.name
                ),
            )
        listed = await self._call(
            f"list {plural} {where} ({self._kube.label_selector})",
            lambda: self._custom.list_namespaced_custom_object(
                group,
                version,
                target.namespace,
                plural,
                label_selector=self._kube.label_selector,
                field_selector=f"metadata.name={target.name}",
            ),
        )
        items = listed.get("items") or [] if isinstance(listed, Mapping) else []
        return items[0] if items else None

    async def _patch(self, target: Target, desired: Mapping[str, int], why: str) -> Target:
        target = await self._after_own_writes(target)
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
        self._note_written(target, obj)
        written = await self.discovery.parse(obj, target) or target.holding(desired)
        if self._is_leader(self._kube.api_timeout):  # an Event is a write too
            await self._tell(target, why)
        self.discovery.remember(written)
        return written

    def _note_written(self, target: Target, obj: Mapping[str, Any]) -> None:
        """``obj`` is what our write left of ``target``'s object, read at its version."""
        key, version = _object(target), target.resource_version
        entry = self._written.get(key)
        following = entry is not None and (
            version in entry.over or version == _resource_version(entry.obj)
        )
        if entry is None or not following or len(entry.over) >= WRITES_IN_A_ROW:
            entry = self._written[key] = _Written(set(), obj)
        entry.over.add(version)
        entry.obj = obj

    async def _after_own_writes(self, target: Target) -> Target:
        """``target`` as our own last write to its object left it, where it was read at a
        version that write (or one before it in a row) moved the object from: another rule of
        the same HTTPRoute read before it, or a watch behind it, would fail the patch's
        ``test`` of the annotations and resourceVersion on changes that are ours alone."""
        entry = self._written.get(_object(target))
        if entry is None or target.resource_version not in entry.over:
            return target
        return await self.discovery.parse(entry.obj, target) or target

    async def _tell(self, target: Target, why: str) -> None:
        """An Event for this write if its mode is new for the target, or the last Event is
        ``EVENT_EVERY`` old; else it is counted into the next one. ``why`` is the loop's
        ``"<mode>: <change>"``."""
        mode = why.partition(":")[0]
        now = self._clock()
        told, at, since = self._told.get(target.key, ("", -EVENT_EVERY, 0))
        if mode == told and now - at < EVENT_EVERY:
            self._told[target.key] = (told, at, since + 1)
            return
        more = f"; {since} more write(s) since the last Event" if since else ""
        await self._event(target, f"Weights changed ({why}){more}")
        self._told[target.key] = (mode, now, 0)

    def _note_foreign_change(self, target: Target, desired: Mapping[str, int]) -> None:
        current = {ref.name: ref.weight for ref in target.refs if ref.name in desired}
        ours = target.last_applied
        was = self._foreign.pop(target.key, None)
        if ours is None or dict(ours) == dict(current):
            if was is not None:
                self._conditions.clear(was)
            return
        # one condition per writer and what it set: a GitOps revert to the same weights every
        # tick is one line; a second person's edit is a line of its own (a review: bob's
        # hand edit was overwritten without a word while alice's condition was open)
        changed_by = objects.last_writer(target.writers, self._kube.field_manager)
        key = ("foreign", target.key, changed_by, _fmt(current))
        if was is not None and was != key:
            self._conditions.clear(was)
        self._foreign[target.key] = key
        self._conditions.observe(
            "replacing weights changed outside the controller",
            key,
            target=target.key,
            changed_by=changed_by,
            found=_fmt(current),
            last_applied_by_us=_fmt(ours),
            new=_fmt(desired),
        )

    async def _event(self, target: Target, message: str) -> None:
        await self._event_on(
            target.kind, target.namespace, target.name, target.uid, "WeightsChanged", message
        )

    async def _event_on(
        self,
        kind: str,
        namespace: str,
        name: str,
        uid: str,
        reason: str,
        message: str,
        kind_of_event: str = "Normal",
    ) -> None:
        now = datetime.now(UTC)
        group, version = (
            objects.HTTPROUTE[:2] if kind == "HTTPRoute" else objects.EXTERNAL_MODEL[:2]
        )
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{name[:200]}.", namespace=namespace),
            involved_object=client.V1ObjectReference(
                api_version=f"{group}/{version}",
                kind=kind,
                name=name,
                namespace=namespace,
                uid=uid or None,
            ),
            reason=reason,
            message=message[:1024],
            type=kind_of_event,
            source=client.V1EventSource(component="weight-controller"),
            reporting_component="weight-controller",
            reporting_instance=self._settings.leader_election.identity or "weight-controller",
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            await self._call(
                f"create event in {namespace}",
                lambda: self._core.create_namespaced_event(namespace, body),
            )
        except APIError as exc:  # an Event is a courtesy; the weights are already written
            self.discovery.count(exc)
            key = f"{kind}/{namespace}/{name}"
            log.warning("could not emit event", target=key, error=str(exc))

    async def _call(self, doing: str, request: Callable[[], Awaitable[T]]) -> T:
        return await call(doing, request, self._kube.api_timeout, self.discovery.gate)


def _object(target: Target) -> tuple[str, str, str]:
    """The object a target is in (an HTTPRoute holds one target per rule)."""
    return target.kind, target.namespace, target.name


def _resource_version(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("resourceVersion", "")) if isinstance(meta, Mapping) else ""


def _gvp(target: Target) -> tuple[str, str, str]:
    return objects.HTTPROUTE if target.kind == "HTTPRoute" else objects.EXTERNAL_MODEL


def _resource(target: Target) -> str:
    group, _, plural = _gvp(target)
    return f"{plural}.{group}"


def _fmt(values: Mapping[str, int]) -> str:
    return " ".join(f"{n}={w}" for n, w in sorted(values.items()))
