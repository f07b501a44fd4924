"""A Kubernetes API server test double on loopback, for the real kubernetes-asyncio client.

It implements the wire behaviour the controller relies on, following the Kubernetes API
conventions (https://kubernetes.io/docs/reference/using-api/api-concepts/):

- Paths: ``/api/v1/namespaces/{ns}/{plural}[/{name}]`` (core, e.g. events) and
  ``/apis/{group}/{version}/namespaces/{ns}/{plural}[/{name}]`` (leases, custom resources).
- GET of one object; LIST with ``labelSelector`` equality terms (``a=b,c=d``), returning a
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
  changed, and records ``managedFields`` (manager from ``?fieldManager=``, operation, time).
- Errors are ``Status`` objects (``kind: Status``, ``reason``, ``code``, ``message``).
- Fault injection: ``fail(method, plural, status, times)`` answers the next matching requests
  with that status; ``before(method, plural, action)`` runs ``action`` (another client's edit,
  a deletion) just before the next matching request is handled — the worst moment for the
  controller; ``stop()``/``start()`` make the server unreachable and back (same port).

Not implemented (not used by the controller): watch, field selectors, server-side apply,
subresources, admission, defaulting beyond the above.
"""

from __future__ import annotations

import copy
import itertools
import json
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import jsonpatch
from aiohttp import web

Json = dict[str, Any]
Key = tuple[str, str, str, str]  # (api prefix, plural, namespace, name)

KINDS = {
    "externalmodels": "ExternalModel",
    "externalproviders": "ExternalProvider",
    "httproutes": "HTTPRoute",
    "leases": "Lease",
    "events": "Event",
}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


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
    requests: list[tuple[str, str, str, Any]] = field(default_factory=list)
    port: int = 0
    _version: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))
    _runner: web.AppRunner | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/v1/namespaces/{ns}/{plural}", self._collection)
        app.router.add_route("*", "/api/v1/namespaces/{ns}/{plural}/{name}", self._item)
        app.router.add_route(
            "*", "/apis/{group}/{version}/namespaces/{ns}/{plural}", self._collection
        )
        app.router.add_route(
            "*", "/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}", self._item
        )
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
    def fail(self, method: str, plural: str, code: int, times: int = 1) -> None:
        self.faults.append(Fault(method, plural, code, times))

    def before(self, method: str, plural: str, action: Callable[[], object]) -> None:
        self.hooks.append(Hook(method, plural, action))

    def put_object(self, prefix: str, plural: str, obj: Json) -> Json:
        """Store ``obj`` as if created through the API (for test set-up)."""
        meta = obj.setdefault("metadata", {})
        stored = self._created(prefix, plural, meta["namespace"], copy.deepcopy(obj), "test-setup")
        self.objects[(prefix, plural, meta["namespace"], meta["name"])] = stored
        return copy.deepcopy(stored)

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
            and r[0] != "GET"
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
        for fault in self.faults:
            if fault.method == request.method and fault.plural == plural and fault.times > 0:
                fault.times -= 1
                return status(fault.code, "Injected", f"injected {fault.code}")
        return None

    async def _collection(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if (injected := self._fault(request)) is not None:
            return injected
        prefix, info = self._prefix(request), request.match_info
        ns, plural = info["ns"], info["plural"]
        if request.method == "GET":
            return self._list(prefix, plural, ns, request.query.get("labelSelector", ""))
        if request.method == "POST":
            return self._create(
                prefix, plural, ns, body, request.query.get("fieldManager", "unknown")
            )
        return status(405, "MethodNotAllowed", request.method)

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
            return web.json_response(current)
        if request.method == "PUT":
            return self._replace(key, current, body, manager)
        if request.method == "PATCH":
            return self._patch(key, current, body, request.content_type, manager)
        return status(405, "MethodNotAllowed", request.method)

    async def _record(self, request: web.Request) -> Any:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        self.requests.append((request.method, request.path, request.content_type, body))
        return body

    def _list(self, prefix: str, plural: str, ns: str, selector: str) -> web.Response:
        terms = [t.split("=", 1) for t in selector.split(",") if t]
        items = [
            copy.deepcopy(obj)
            for (p, pl, n, _), obj in sorted(self.objects.items())
            if (p, pl, n) == (prefix, plural, ns)
            and all((obj["metadata"].get("labels") or {}).get(k) == v for k, v in terms)
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
            creationTimestamp=_now(),
            generation=1,
            resourceVersion=str(next(self._version)),
        )
        meta["managedFields"] = [self._managed(manager, prefix, "Update")]
        body.setdefault("apiVersion", prefix)
        body.setdefault("kind", KINDS.get(plural, "Object"))
        return body

    def _create(self, prefix: str, plural: str, ns: str, body: Json, manager: str) -> web.Response:
        obj = self._created(prefix, plural, ns, body, manager)
        key = (prefix, plural, ns, obj["metadata"]["name"])
        if key in self.objects:
            return status(409, "AlreadyExists", f'{plural} "{key[3]}" already exists')
        self.objects[key] = obj
        return web.json_response(obj, status=201)

    def _replace(self, key: Key, current: Json, body: Json, manager: str) -> web.Response:
        given = (body.get("metadata") or {}).get("resourceVersion")
        if given and given != current["metadata"]["resourceVersion"]:
            return status(
                409,
                "Conflict",
                "the object has been modified; please apply your "
                "changes to the latest version and try again",
            )
        return web.json_response(self._store(key, body, manager, "Update"))

    def _patch(
        self, key: Key, current: Json, body: Any, content_type: str, manager: str
    ) -> web.Response:
        if content_type == "application/json-patch+json":
            try:
                patched = jsonpatch.JsonPatch(body).apply(copy.deepcopy(current))
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                return status(422, "Invalid", f"the server rejected our request: {exc}")
        elif content_type == "application/merge-patch+json":
            patched = merge_patch(copy.deepcopy(current), body)
        else:
            return status(415, "UnsupportedMediaType", f"{content_type} is not supported here")
        return web.json_response(self._store(key, patched, manager, "Update"))

    def _store(self, key: Key, obj: Json, manager: str, operation: str) -> Json:
        old = self.objects[key]
        meta = obj.setdefault("metadata", {})
        for kept in ("uid", "creationTimestamp", "namespace", "name"):
            meta[kept] = old["metadata"][kept]
        meta["generation"] = old["metadata"].get("generation", 1) + (
            obj.get("spec") != old.get("spec")
        )
        meta["resourceVersion"] = str(next(self._version))
        fields = [f for f in old["metadata"].get("managedFields", []) if f["manager"] != manager]
        meta["managedFields"] = [*fields, self._managed(manager, key[0], operation)]
        self.objects[key] = obj
        return copy.deepcopy(obj)

    @staticmethod
    def _managed(manager: str, prefix: str, operation: str) -> Json:
        return {
            "manager": manager,
            "operation": operation,
            "apiVersion": prefix,
            "time": _now(),
            "fieldsType": "FieldsV1",
            "fieldsV1": {},
        }


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
