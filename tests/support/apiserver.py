"""A Kubernetes API server test double on loopback, for the real kubernetes-asyncio client.

It implements the wire behaviour the controller relies on, following the Kubernetes API
conventions (https://kubernetes.io/docs/reference/using-api/api-concepts/):

- Paths: ``/api/v1/namespaces/{ns}/{plural}[/{name}]`` (core, e.g. events) and
  ``/apis/{group}/{version}/namespaces/{ns}/{plural}[/{name}]`` (leases, custom resources).
- GET of one object; LIST with ``labelSelector`` equality terms (``a=b,c=d``) and
  ``fieldSelector`` on ``metadata.name``/``metadata.namespace`` (what every kind, custom
  resources too, can be selected by; another field is a ``400 BadRequest``), returning a
  ``{kind}List`` with ``metadata.resourceVersion``.
- POST creates; ``metadata.generateName`` gets a random suffix; an existing name is
  ``409 AlreadyExists``.
- PUT replaces; a ``metadata.resourceVersion`` that is not the current one is ``409 Conflict``
  (optimistic concurrency); without one the update is unconditional.
- PATCH with ``application/json-patch+json`` (RFC 6902, incl. ``test``; a failed ``test`` or a
  bad path is ``422 Invalid`` and nothing is changed) and ``application/merge-patch+json``
  (RFC 7386; lists are replaced whole). Strategic merge patch is ``415`` for custom resources,
  as on a real server.
- Every write bumps a global ``resourceVersion``, bumps ``metadata.generation`` when ``spec``
  changed, and records ``managedFields`` (manager from ``?fieldManager=``, operation, time at
  one-second precision as the server stores it, ``subresource`` for ``/status``).
- ExternalModels and ExternalProviders are admitted as a CRD-backed server admits them, with
  the upstream CRDs of ``crd_version`` (``v0.2.0`` or ``v0.2.1``; tests/support/crds.py): unknown fields
  pruned, defaults applied, schema violations a ``422 Invalid`` whose ``details.causes`` name the
  field (``NewInvalid`` in k8s.io/apimachinery). A failed JSON Patch ``test`` is a 422 *without*
  causes, as in the API server's patch handler. A custom-resource PUT without
  ``metadata.resourceVersion`` is a 422 (``must be specified for an update``). The ``status``
  subresource: writes to the main resource keep the old ``status``.
- Lease ``acquireTime``/``renewTime`` (MicroTime) must match the server's fixed layout
  ``2006-01-02T15:04:05.000000Z07:00`` (six fractional digits), else ``400 BadRequest``.
- ``status_writer``: a second client that, after every spec change of an ExternalModel, writes
  its ``status`` through the subresource, as the payload processor does.
- Errors are ``Status`` objects (``kind: Status``, ``reason``, ``code``, ``message``).
- Fault injection: ``fail(method, plural, status, times)`` answers the next matching requests
  with that status; ``before(method, plural, action)`` runs ``action`` (another client's edit,
  a deletion) just before the next matching request is handled — the worst moment for the
  controller; ``stop()``/``start()`` make the server unreachable and back (same port).

- Watches (``?watch=true``) of a collection, with bookmarks, ``410 Gone`` after ``compact()``
  and careless proxies (``watch_fault``).

Not implemented (not used by the controller): field selectors, server-side apply, admission
beyond the above (Services and InferencePools are stored as given).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import re
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonpatch
from aiohttp import web

from tests.support import crds

Json = dict[str, Any]
Key = tuple[str, str, str, str]  # (api prefix, plural, namespace, name)

KINDS = {
    "externalmodels": "ExternalModel",
    "externalproviders": "ExternalProvider",
    "httproutes": "HTTPRoute",
    "leases": "Lease",
    "events": "Event",
    "services": "Service",
    "inferencepools": "InferencePool",
}


def _now(offset: float = 0.0) -> str:
    """managedFields times: the server stores metav1.Time, whole seconds."""
    when = datetime.now(UTC) + timedelta(seconds=offset)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


# metav1.MicroTime's RFC3339Micro layout, "2006-01-02T15:04:05.000000Z07:00": exactly six
# fractional digits (k8s.io/apimachinery/pkg/apis/meta/v1/micro_time.go).
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")


def status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


@dataclass
class Fault:
    method: str
    plural: str
    code: int
    times: int
    seconds: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None  # answered with code 200 instead: text as HTML (a proxy's), else JSON
    namespace: str | None = None  # only requests in this namespace


@dataclass
class Hook:
    method: str
    plural: str
    action: Callable[[], object]


@dataclass
class FakeAPIServer:
    objects: dict[Key, Json] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    hooks: list[Hook] = field(default_factory=list)
    delays: list[Fault] = field(default_factory=list)
    late: list[Fault] = field(default_factory=list)  # applied at once, answered late
    requests: list[tuple[str, str, str, Any]] = field(default_factory=list)
    port: int = 0
    crd_version: str = "v0.2.1"
    status_writer: str | None = None
    crd_readable: bool = True
    clock_offset: float = 0.0  # seconds added to the times it stamps (see ``advance``)
    # TokenReview: token -> user; SubjectAccessReview: (user, non-resource path) allowed
    users: dict[str, str] = field(default_factory=dict)
    grants: set[tuple[str, str]] = field(default_factory=set)
    rejected: list[Json] = field(default_factory=list)  # every 422 with causes we answered
    waiting: int = 0  # requests held by ``slow`` right now, and the most at once
    most_waiting: int = 0
    # LISTs answered (plural, namespace or "" for all), and watches opened; every change since
    # start as (resourceVersion, key, before, after) for watches to replay from a version
    listed: list[tuple[str, str]] = field(default_factory=list)
    watches: int = 0
    # A careless proxy in front of every watch: "empty" (200, an empty body, at once),
    # "silent" (accepted, then nothing until its timeout), "not-json" (a line of HTML),
    # "gone" (410 at once), "bookmark" (one bookmark, then the end)
    watch_fault: str | None = None
    changes: list[tuple[int, Key, Json | None, Json | None]] = field(default_factory=list)
    compacted: int = 0  # a watch from a version at or below this gets 410 Gone
    _changed: asyncio.Event | None = None
    _epoch: int = 0
    _version: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))
    _runner: web.AppRunner | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/v1/namespaces/{ns}/{plural}", self._collection)
        app.router.add_route("*", "/api/v1/namespaces/{ns}/{plural}/{name}", self._late_item)
        app.router.add_route(
            "*", "/apis/{group}/{version}/namespaces/{ns}/{plural}", self._collection
        )
        app.router.add_route(
            "*", "/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}", self._late_item
        )
        app.router.add_route(
            "*", "/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}/status", self._status
        )
        app.router.add_route("GET", "/apis/{group}/{version}/{plural}", self._cluster_list)
        app.router.add_route("POST", "/apis/{group}/{version}/{plural}", self._review)
        app.router.add_route("GET", "/apis/{group}/{version}/{plural}/{name}", self._cluster_get)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=0.1
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---- test helpers ----------------------------------------------------------------------
    def fail(
        self,
        method: str,
        plural: str,
        code: int,
        times: int = 1,
        headers: dict[str, str] | None = None,
        body: Any = None,
        namespace: str | None = None,
    ) -> None:
        """The next ``times`` matching requests (in ``namespace``, if given) answered
        ``code``; with ``body``, answered 200 with it: a proxy's page, or JSON that is no
        List."""
        fault = Fault(method, plural, code, times, headers=headers or {}, body=body)
        fault.namespace = namespace
        self.faults.append(fault)

    def slow(self, method: str, plural: str, seconds: float, times: int = 1) -> None:
        """Answer the next ``times`` matching requests ``seconds`` late (a loaded server)."""
        self.delays.append(Fault(method, plural, 0, times, seconds))

    def answer_late(self, method: str, plural: str, seconds: float, times: int = 1) -> None:
        """Apply the next ``times`` matching requests at once but answer them ``seconds``
        late: a write that lands after the client stopped waiting for it."""
        self.late.append(Fault(method, plural, 0, times, seconds))

    def advance(self, seconds: float) -> None:
        """Move the time the double stamps on writes forward (a later edit by someone else)."""
        self.clock_offset += seconds

    def before(self, method: str, plural: str, action: Callable[[], object]) -> None:
        self.hooks.append(Hook(method, plural, action))

    def put_object(self, prefix: str, plural: str, obj: Json) -> Json:
        """Store ``obj`` as if created through the API (for test set-up); it must pass the
        same admission as a real create."""
        meta = obj.setdefault("metadata", {})
        admitted, causes = self._admit(plural, copy.deepcopy(obj))
        assert not causes, f"test set-up object is invalid for {self.crd_version}: {causes}"
        stored = self._created(prefix, plural, meta["namespace"], admitted, "test-setup")
        key = (prefix, plural, meta["namespace"], meta["name"])
        old = self.objects.get(key)
        self.objects[key] = stored
        self._emit(key, old, stored)
        return copy.deepcopy(stored)

    def delete(self, prefix: str, plural: str, namespace: str, name: str) -> None:
        """Delete a stored object as another client would (watches see it go)."""
        key = (prefix, plural, namespace, name)
        self._emit(key, self.objects.pop(key), None)

    def get(self, prefix: str, plural: str, namespace: str, name: str) -> Json | None:
        found = self.objects.get((prefix, plural, namespace, name))
        return copy.deepcopy(found) if found else None

    def edit(
        self, prefix: str, plural: str, namespace: str, name: str, manager: str, change: Any
    ) -> Json:
        """Change a stored object as another client would (``change`` mutates a copy)."""
        obj = copy.deepcopy(self.objects[(prefix, plural, namespace, name)])
        change(obj)
        return self._store((prefix, plural, namespace, name), obj, manager, "Update")

    def writes(
        self, method: str | None = None, plural: str | None = None
    ) -> list[tuple[str, str, str, Any]]:
        return [
            r
            for r in self.requests
            if (method is None or r[0] == method)
            and (plural is None or f"/{plural}" in r[1])
            and r[0] not in ("GET", "WATCH")  # reads
        ]

    # ---- handlers --------------------------------------------------------------------------
    def _prefix(self, request: web.Request) -> str:
        info = request.match_info
        return f"{info['group']}/{info['version']}" if "group" in info else "v1"

    def _fault(self, request: web.Request) -> web.Response | None:
        plural = request.match_info["plural"]
        for hook in list(self.hooks):
            if hook.method == request.method and hook.plural == plural:
                self.hooks.remove(hook)
                hook.action()
        watching = request.query.get("watch", "").lower() in ("true", "1")
        for fault in self.faults:
            if fault.body is not None and watching:  # a body stands for a LIST's answer
                continue
            if fault.namespace not in (None, request.match_info.get("ns")):
                continue
            if fault.method == request.method and fault.plural == plural and fault.times > 0:
                fault.times -= 1
                if isinstance(fault.body, str):
                    return web.Response(text=fault.body, content_type="text/html")
                if fault.body is not None:
                    return web.json_response(fault.body)
                answer = status(fault.code, "Injected", f"injected {fault.code}")
                answer.headers.update(fault.headers)
                return answer
        return None

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        if (injected := self._fault(request)) is not None:
            return injected
        prefix, info = self._prefix(request), request.match_info
        ns, plural = info["ns"], info["plural"]
        selector = request.query.get("labelSelector", "")
        if request.method == "GET" and request.query.get("watch", "").lower() in ("true", "1"):
            return await self._watch(request, (prefix, plural, ns), selector)
        if request.method == "GET":
            self.listed.append((plural, ns))
            return self._list(prefix, plural, ns, selector, request.query.get("fieldSelector"))
        if request.method == "POST":
            return self._create(
                prefix, plural, ns, body, request.query.get("fieldManager", "unknown")
            )
        return status(405, "MethodNotAllowed", request.method)

    async def _late_item(self, request: web.Request) -> web.Response:
        answer = await self._item(request)
        for late in self.late:
            plural = request.match_info.get("plural")
            if (late.method, late.plural) == (request.method, plural) and late.times > 0:
                late.times -= 1
                await asyncio.sleep(late.seconds)
                break
        return answer

    async def _item(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if (injected := self._fault(request)) is not None:
            return injected
        info = request.match_info
        key = (self._prefix(request), info["plural"], info["ns"], info["name"])
        current = self.objects.get(key)
        if current is None:
            return status(404, "NotFound", f'{info["plural"]} "{info["name"]}" not found')
        manager = request.query.get("fieldManager", "unknown")
        if request.method == "GET":
            return web.json_response(current)
        if request.method == "DELETE":
            del self.objects[key]
            self._emit(key, current, None)
            return web.json_response(current)
        if request.method == "PUT":
            return self._replace(key, current, body, manager)
        if request.method == "PATCH":
            return self._patch(key, current, body, request.content_type, manager)
        return status(405, "MethodNotAllowed", request.method)

    async def _status(self, request: web.Request) -> web.Response:
        """The ``/status`` subresource: only ``status`` changes."""
        body = await self._record(request)
        info = request.match_info
        key = (self._prefix(request), info["plural"], info["ns"], info["name"])
        current = self.objects.get(key)
        if current is None:
            return status(404, "NotFound", f'{info["plural"]} "{info["name"]}" not found')
        if request.method != "PUT":
            return status(405, "MethodNotAllowed", request.method)
        updated = copy.deepcopy(current)
        updated["status"] = (body or {}).get("status")
        manager = request.query.get("fieldManager", "unknown")
        return web.json_response(self._store(key, updated, manager, "Update", "status"))

    async def _cluster_get(self, request: web.Request) -> web.Response:
        """Cluster-scoped GET: the installed CRDs (``crd_version``'s, unless ``crd_readable``
        is off, as for a service account without that grant: 403)."""
        await self._record(request)
        if (injected := self._fault(request)) is not None:
            return injected
        info = request.match_info
        if info["plural"] != "customresourcedefinitions":
            return status(404, "NotFound", f"{info['plural']} is not served here")
        if not self.crd_readable:
            return status(403, "Forbidden", "customresourcedefinitions is forbidden")
        for plural in crds.PLURALS:
            found = crds.crd(self.crd_version, plural)
            if found["metadata"]["name"] == info["name"]:
                return web.json_response(found)
        return status(404, "NotFound", f'customresourcedefinitions "{info["name"]}" not found')

    async def _review(self, request: web.Request) -> web.Response:
        """TokenReview (authentication.k8s.io/v1) and SubjectAccessReview
        (authorization.k8s.io/v1) for non-resource URLs, from ``users`` and ``grants``."""
        body = await self._record(request) or {}
        if (injected := self._fault(request)) is not None:
            return injected
        plural, spec = request.match_info["plural"], body.get("spec") or {}
        if plural == "tokenreviews":
            user = self.users.get(spec.get("token", ""))
            answer: Json = {"authenticated": user is not None}
            if user is not None:
                answer["user"] = {
                    "username": user,
                    "uid": f"uid-{user}",
                    "groups": ["system:authenticated"],
                }
        elif plural == "subjectaccessreviews":
            path = (spec.get("nonResourceAttributes") or {}).get("path", "")
            verb = (spec.get("nonResourceAttributes") or {}).get("verb", "")
            answer = {"allowed": verb == "get" and (spec.get("user"), path) in self.grants}
        else:
            return status(404, "NotFound", f"{plural} is not served here")
        return web.json_response({**body, "status": answer}, status=201)

    async def _cluster_list(self, request: web.Request) -> web.StreamResponse:
        """A LIST across every namespace (``/apis/{group}/{version}/{plural}``)."""
        await self._record(request)
        if (injected := self._fault(request)) is not None:
            return injected
        info = request.match_info
        prefix = f"{info['group']}/{info['version']}"
        selector = request.query.get("labelSelector", "")
        if request.query.get("watch", "").lower() in ("true", "1"):
            return await self._watch(request, (prefix, info["plural"], None), selector)
        self.listed.append((info["plural"], ""))
        namespaces = sorted(
            {n for (p, pl, n, _) in self.objects if (p, pl) == (prefix, info["plural"])}
        )
        items = []
        for ns in namespaces:
            listed = json.loads(self._list(prefix, info["plural"], ns, selector).text or "{}")
            items += listed["items"]
        kind = KINDS.get(info["plural"], "Object") + "List"
        meta = {"resourceVersion": str(next(self._version))}
        return web.json_response(
            {"apiVersion": prefix, "kind": kind, "items": items, "metadata": meta}
        )

    # ---- watch ---------------------------------------------------------------------------
    def _emit(self, key: Key, before: Json | None, after: Json | None) -> None:
        version = int((after or before or {}).get("metadata", {}).get("resourceVersion", 0) or 0)
        if after is None:  # a deletion is a change of its own
            version = next(self._version)
        self.changes.append((version, key, copy.deepcopy(before), copy.deepcopy(after)))
        if self._changed is not None:
            self._changed.set()

    def compact(self) -> None:
        """Forget the change history, as etcd compaction does: a watch from any version seen
        so far is answered 410 Gone, and its client must LIST again."""
        self.compacted = next(self._version)
        self.changes = []
        self._epoch += 1  # open watches end, and come back from a version now too old
        if self._changed is not None:
            self._changed.set()

    async def _watch(
        self, request: web.Request, scope: tuple[str, str, str | None], selector: str
    ) -> web.StreamResponse:
        """``?watch=true``: every change after ``resourceVersion`` in ``scope`` as a JSON line
        (an object entering the label selector is ADDED, leaving it DELETED), a BOOKMARK at the
        end of ``timeoutSeconds`` when asked, ``410 Gone`` (an ERROR event) from a compacted
        version."""
        self.watches += 1
        terms = [t.split("=", 1) for t in selector.split(",") if t]

        def selected(obj: Json | None) -> bool:
            labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
            return obj is not None and all(labels.get(k) == v for k, v in terms)

        since = int(request.query.get("resourceVersion") or 0)
        seconds = min(float(request.query.get("timeoutSeconds") or 30), 30.0)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if self.watch_fault is not None:
            return await self._faulty_watch(request, response, seconds)

        async def send(kind: str, obj: Json) -> None:
            await response.write((json.dumps({"type": kind, "object": obj}) + "\n").encode())

        if since and since <= self.compacted:
            gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410}
            await send(
                "ERROR", {**gone, "reason": "Expired", "message": "too old resource version"}
            )
            return response
        if self._changed is None:
            self._changed = asyncio.Event()
        loop = asyncio.get_running_loop()
        ends = loop.time() + seconds
        sent, epoch = since, self._epoch
        while self._epoch == epoch:
            self._changed.clear()  # before the scan: a change during it wakes the wait at once
            for version, key, before, after in list(self.changes):
                if version <= sent or key[:2] != scope[:2] or scope[2] not in (None, key[2]):
                    continue
                sent = version
                was, now = selected(before), selected(after)
                if now:
                    await send("MODIFIED" if was else "ADDED", copy.deepcopy(after or {}))
                elif was:
                    await send("DELETED", copy.deepcopy(after or before or {}))
            left = ends - loop.time()
            if left <= 0:
                break
            try:
                async with asyncio.timeout(left):
                    await self._changed.wait()
            except TimeoutError:
                pass
        if self._epoch != epoch:
            return response  # compacted under this watch: it ends, no bookmark
        if request.query.get("allowWatchBookmarks", "").lower() in ("true", "1"):
            mark = {"metadata": {"resourceVersion": str(next(self._version))}}
            await send("BOOKMARK", {"kind": KINDS.get(scope[1], "Object"), **mark})
        return response

    async def _faulty_watch(
        self, request: web.Request, response: web.StreamResponse, seconds: float
    ) -> web.StreamResponse:
        if self.watch_fault == "not-json":
            await response.write(b"<html><body>502 Bad Gateway</body></html>\n")
        elif self.watch_fault == "gone":  # every watch 410, at once
            gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410}
            event = {"type": "ERROR", "object": {**gone, "reason": "Expired", "message": "old"}}
            await response.write((json.dumps(event) + "\n").encode())
        elif self.watch_fault == "bookmark":  # one bookmark, and the end, at once
            mark = {
                "kind": "ExternalModel",
                "metadata": {"resourceVersion": str(next(self._version))},
            }
            await response.write((json.dumps({"type": "BOOKMARK", "object": mark}) + "\n").encode())
        elif self.watch_fault == "silent":  # until the client gives up, or its timeout
            ends = asyncio.get_running_loop().time() + seconds
            while asyncio.get_running_loop().time() < ends:
                transport = request.transport
                if transport is None or transport.is_closing():
                    break
                await asyncio.sleep(0.05)
        return response

    def _admit(self, plural: str, obj: Json) -> tuple[Json, list[Json]]:
        if plural in crds.PLURALS:
            return crds.admit(self.crd_version, plural, obj)
        if plural == "httproutes":
            return obj, _route_causes(obj)
        if plural == "leases":
            spec = obj.get("spec") or {}
            bad = [
                {"reason": "FieldValueInvalid", "field": f"spec.{k}", "message": str(spec[k])}
                for k in ("acquireTime", "renewTime")
                if spec.get(k) is not None and not MICRO_TIME.match(str(spec[k]))
            ]
            return obj, bad
        return obj, []

    def _invalid(self, plural: str, name: str, causes: list[Json]) -> web.Response:
        if plural == "leases":  # a MicroTime that does not parse fails decoding: 400
            return status(400, "BadRequest", f"Time parse error: {causes[0]['message']}")
        group = (
            "gateway.networking.k8s.io" if plural == "httproutes" else "inference.opendatahub.io"
        )
        kind = f"{KINDS.get(plural, 'Object')}.{group}"
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f'{kind} "{name}" is invalid: '
            + ", ".join(f"{c['field']}: {c['message']}" for c in causes),
            "reason": "Invalid",
            "details": {
                "name": name,
                "group": group,
                "kind": KINDS.get(plural),
                "causes": causes,
            },
            "code": 422,
        }
        self.rejected.append(body)
        return web.json_response(body, status=422)

    async def _record(self, request: web.Request) -> Any:
        for delay in self.delays:
            plural = request.match_info.get("plural")
            if (delay.method, delay.plural) == (request.method, plural) and delay.times > 0:
                delay.times -= 1
                self.waiting += 1
                self.most_waiting = max(self.most_waiting, self.waiting)
                try:
                    await asyncio.sleep(delay.seconds)
                finally:
                    self.waiting -= 1
                break
        raw = await request.read()
        body = json.loads(raw) if raw else None
        watching = request.query.get("watch", "").lower() in ("true", "1")
        method = "WATCH" if watching else request.method  # a GET, but its own RBAC verb
        self.requests.append((method, request.path, request.content_type, body))
        return body

    def _list(
        self, prefix: str, plural: str, ns: str, selector: str, fields: str | None = None
    ) -> web.Response:
        terms = [t.split("=", 1) for t in selector.split(",") if t]
        wanted = [t.split("=", 1) for t in (fields or "").split(",") if t]
        if unknown := [f for f, _ in wanted if f not in ("metadata.name", "metadata.namespace")]:
            return status(400, "BadRequest", f'field label not supported: "{unknown[0]}"')
        items = [
            copy.deepcopy(obj)
            for (p, pl, n, _), obj in sorted(self.objects.items())
            if (p, pl, n) == (prefix, plural, ns)
            and all((obj["metadata"].get("labels") or {}).get(k) == v for k, v in terms)
            and all(obj["metadata"].get(f.removeprefix("metadata.")) == v for f, v in wanted)
        ]
        kind = KINDS.get(plural, "Object") + "List"
        return web.json_response(
            {
                "apiVersion": prefix,
                "kind": kind,
                "items": items,
                "metadata": {"resourceVersion": str(next(self._version))},
            }
        )

    def _created(self, prefix: str, plural: str, ns: str, body: Json, manager: str) -> Json:
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)
        meta.update(
            namespace=ns,
            uid=str(uuid.uuid4()),
            creationTimestamp=_now(self.clock_offset),
            generation=1,
            resourceVersion=str(next(self._version)),
        )
        meta["managedFields"] = [self._managed(manager, prefix, "Update")]
        body.setdefault("apiVersion", prefix)
        body.setdefault("kind", KINDS.get(plural, "Object"))
        return body

    def _create(self, prefix: str, plural: str, ns: str, body: Json, manager: str) -> web.Response:
        body, causes = self._admit(plural, body)
        if causes:
            return self._invalid(plural, (body.get("metadata") or {}).get("name", ""), causes)
        obj = self._created(prefix, plural, ns, body, manager)
        key = (prefix, plural, ns, obj["metadata"]["name"])
        if key in self.objects:
            return status(409, "AlreadyExists", f'{plural} "{key[3]}" already exists')
        self.objects[key] = obj
        self._emit(key, None, obj)
        return web.json_response(obj, status=201)

    def _replace(self, key: Key, current: Json, body: Json, manager: str) -> web.Response:
        given = (body.get("metadata") or {}).get("resourceVersion")
        if not given and key[1] in crds.PLURALS:  # custom resources: no unconditional update
            cause = {
                "reason": "FieldValueInvalid",
                "field": "metadata.resourceVersion",
                "message": "Invalid value: 0x0: must be specified for an update",
            }
            return self._invalid(key[1], key[3], [cause])
        if given and given != current["metadata"]["resourceVersion"]:
            return status(
                409,
                "Conflict",
                "the object has been modified; please apply your "
                "changes to the latest version and try again",
            )
        body, causes = self._admit(key[1], body)
        if causes:
            return self._invalid(key[1], key[3], causes)
        return web.json_response(self._store(key, body, manager, "Update"))

    def _patch(
        self, key: Key, current: Json, body: Any, content_type: str, manager: str
    ) -> web.Response:
        if content_type == "application/json-patch+json":
            try:
                patched = jsonpatch.JsonPatch(body).apply(copy.deepcopy(current))
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                # NewGenericServerResponse(422, ...) in the patch handler: no causes
                return status(422, "Invalid", f"the server rejected our request: {exc}")
        elif content_type == "application/merge-patch+json":
            patched = merge_patch(copy.deepcopy(current), body)
        else:
            return status(415, "UnsupportedMediaType", f"{content_type} is not supported here")
        patched, causes = self._admit(key[1], patched)
        if causes:
            return self._invalid(key[1], key[3], causes)
        return web.json_response(self._store(key, patched, manager, "Update"))

    def _store(
        self, key: Key, obj: Json, manager: str, operation: str, subresource: str | None = None
    ) -> Json:
        old = self.objects[key]
        if key[1] in crds.PLURALS and subresource is None:
            obj["status"] = copy.deepcopy(old.get("status"))  # the status subresource owns it
            if obj["status"] is None:
                obj.pop("status")
        meta = obj.setdefault("metadata", {})
        for kept in ("uid", "creationTimestamp", "namespace", "name"):
            meta[kept] = old["metadata"][kept]
        meta["generation"] = old["metadata"].get("generation", 1) + (
            obj.get("spec") != old.get("spec")
        )
        meta["resourceVersion"] = str(next(self._version))
        fields = [
            f
            for f in old["metadata"].get("managedFields", [])
            if (f["manager"], f.get("subresource")) != (manager, subresource)
        ]
        entry = self._managed(manager, key[0], operation, subresource)
        meta["managedFields"] = [*fields, entry]
        self.objects[key] = obj
        self._emit(key, old, obj)
        spec_changed = obj.get("spec") != old.get("spec")
        if self.status_writer and key[1] == "externalmodels" and spec_changed:
            self.payload_processor_status(key)
        return copy.deepcopy(obj)  # as this write left it (a status writer may follow)

    def payload_processor_status(self, key: Key) -> None:
        """The payload processor reconciles the changed ExternalModel and writes its status."""
        assert self.status_writer is not None
        obj = copy.deepcopy(self.objects[key])
        generation = obj["metadata"]["generation"]
        obj["status"] = {"phase": "Ready", "observedGeneration": generation}
        self._store(key, obj, self.status_writer, "Update", "status")

    def _managed(
        self, manager: str, prefix: str, operation: str, subresource: str | None = None
    ) -> Json:
        entry = {
            "manager": manager,
            "operation": operation,
            "apiVersion": prefix,
            "time": _now(self.clock_offset),
            "fieldsType": "FieldsV1",
            "fieldsV1": {},
        }
        if subresource is not None:
            entry["subresource"] = subresource
        return entry


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON Merge Patch."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = merge_patch(target.get(key), value)
    return target


# Gateway API's BackendRef.weight: an integer of 0..1,000,000 (``+kubebuilder:validation:Minimum=0``,
# ``Maximum=1000000``, sigs.k8s.io/gateway-api apis/v1/shared_types.go), as the API server's
# structural schema refuses it: 422 with a cause per field.
ROUTE_WEIGHT_MAX = 1_000_000


def _route_causes(obj: Json) -> list[Json]:
    causes = []
    rules = (obj.get("spec") or {}).get("rules") or []
    for r, rule in enumerate(rules):
        for b, backend in enumerate(rule.get("backendRefs") or []):
            weight = backend.get("weight", 1)
            field = f"spec.rules[{r}].backendRefs[{b}].weight"
            if isinstance(weight, bool) or not isinstance(weight, int):
                causes.append(
                    {
                        "reason": "FieldValueTypeInvalid",
                        "field": field,
                        "message": "must be integer",
                    }
                )
            elif not 0 <= weight <= ROUTE_WEIGHT_MAX:
                bound = (
                    "greater than or equal to 0" if weight < 0 else "less than or equal to 1000000"
                )
                message = f"Invalid value: {weight}: {field} in body should be {bound}"
                causes.append({"reason": "FieldValueInvalid", "field": field, "message": message})
    return causes
