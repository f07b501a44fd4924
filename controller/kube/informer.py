"""One kind of object in one scope (a namespace, or all of them), kept by LIST then WATCH, as
client-go's reflector does: the tick reads the cache, not the API server.

- The first LIST fills the cache and gives the resourceVersion to watch from; the watch
  (``allowWatchBookmarks``: the server says how far it has got even when nothing of ours
  changed) applies ADDED/MODIFIED/DELETED as they come.
- A watch ends after ``WATCH_SECONDS`` (server-side ``timeoutSeconds``) and is opened again from
  the last version seen; ``410 Gone`` (the version was compacted away) means LIST again.
- A watch that ends having said nothing, not even a bookmark (a proxy answering 200 with an
  empty body), is an error: the API server sends a bookmark at least every minute and right
  before a watch's deadline. So is one that says nothing for ``watch_idle`` (it is dropped),
  and a line that is not a watch event (named by its first bytes).
- Any failure keeps the cache as it was and LISTs again after a backoff (jittered, doubling
  from 1 s to ``BACKOFF_MAX``, reset by a watch that heard something). While a LIST fails,
  ``error`` says why, so discovery can report the API unreadable; while only watches fail, the
  cache is the last LIST's, never older than a backoff.

Nothing here decides anything: ``controller.kube.discovery`` reads them through ``Lister``,
which LISTs on every call instead when watching is off (``kubernetes.watch: false``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from controller.kube.errors import (
    API_EXCEPTIONS,
    APIError,
    APIGate,
    APITimeoutError,
    call,
    list_of,
    translate,
)
from controller.kube.sdk import ApiException, client, watch

log = structlog.get_logger("controller.informer")

WATCH_SECONDS = 300  # a watch is reopened this often, from the last version seen
# Every failed watch is followed by a LIST, which is what brings a change a broken watch
# missed: the cap keeps a model added meanwhile seen within ~10 s of a watch that keeps failing
# (a LIST every 8 s at worst costs an API server nothing).
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 8.0
IDLE_SECONDS = 90.0  # kubernetes.watch_idle's default
# A watch over sooner than this, even one that said something (a 410 every time, one bookmark
# and the end), is followed by a backoff before the next, as client-go's reflector paces its
# ListAndWatch: a server that ends every watch at once must not make a loop of it.
SHORT_WATCH = 1.0
Json = dict[str, Any]


# The list/watch arguments Informer passes, as the API's query parameters.
_QUERY = {
    "label_selector": "labelSelector",
    "resource_version": "resourceVersion",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "timeout_seconds": "timeoutSeconds",
    "watch": "watch",
}


class CoreObjects:
    """``CustomObjectsApi``'s two list calls for the core group (``/api/v1``: Services), with
    its arguments and its answer, plain JSON: what ``Informer`` keeps, for any group. (The
    typed ``CoreV1Api`` would answer models, not the objects as the server sent them.)"""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api

    async def list_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, **kwargs: Any
    ) -> Any:
        return await self._list(f"/api/{version}/namespaces/{namespace}/{plural}", kwargs)

    async def list_cluster_custom_object(
        self, group: str, version: str, plural: str, **kwargs: Any
    ) -> Any:
        return await self._list(f"/api/{version}/{plural}", kwargs)

    async def _list(self, path: str, kwargs: dict[str, Any]) -> Any:
        options = ("_preload_content", "_request_timeout")
        if unknown := sorted(set(kwargs) - set(_QUERY) - set(options)):
            raise TypeError(f"list {path}: unexpected arguments {unknown}")
        query = [(_QUERY[k], v) for k, v in kwargs.items() if k in _QUERY and v is not None]
        return await self._api.call_api(
            path,
            "GET",
            {},
            query,
            {"Accept": "application/json"},
            response_types_map={200: "object"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=kwargs.get("_preload_content", True),
            _request_timeout=kwargs.get("_request_timeout"),
        )


class Informer:
    def __init__(
        self,
        custom: client.CustomObjectsApi | CoreObjects,
        gvp: tuple[str, str, str],
        namespace: str | None,
        selector: str,
        api_timeout: float,
        gate: APIGate | None = None,
        idle: float = IDLE_SECONDS,
        rng: random.Random | None = None,
    ) -> None:
        self._custom, self._gvp = custom, gvp
        self._namespace, self._selector = namespace, selector
        self._timeout, self._gate = api_timeout, gate
        self._idle = idle
        self._random = rng or random.Random()
        self.watches = 0  # watch requests made: for tests and benchmarks
        self._items: dict[tuple[str, str], Json] = {}
        self.synced = asyncio.Event()  # the cache holds a whole LIST (or more)
        self.tried = asyncio.Event()  # a LIST was answered, or failed (``error`` says why)
        self.error: APIError | None = None  # why the last LIST or watch failed, until one works
        self._task: asyncio.Task[None] | None = None

    @property
    def scope(self) -> str:
        return f"{self._gvp[2]} in {self._namespace or 'all namespaces'}"

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"informer {self.scope}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def objects(self) -> list[Json]:
        """The objects as last seen, by namespace and name."""
        return [self._items[key] for key in sorted(self._items)]

    async def _run(self) -> None:
        backoff = BACKOFF_FIRST
        loop = asyncio.get_running_loop()
        while True:
            listed = False
            try:
                since: str | None = await self.relist()
                listed = True
                while since is not None:  # None: a 410, LIST again
                    began = loop.time()
                    since = await self._watch(since)
                    if loop.time() - began >= SHORT_WATCH:
                        backoff = BACKOFF_FIRST  # a watch that lasted: all is well
                    else:  # over at once, whatever it said (a 410, one bookmark): paced
                        await asyncio.sleep(self._jittered(backoff))
                        backoff = min(BACKOFF_MAX, backoff * 2)
            except Exception as raised:
                # A LIST that fails leaves the API unreadable (discovery keeps its targets);
                # a watch that fails after a LIST that worked leaves the cache that LIST gave,
                # and the next LIST, a backoff later, brings what the watch missed. Whatever
                # failed, the informer lists again: one that ended left its scope's cache
                # frozen, or its first LIST awaited forever (an attack).
                exc = (
                    raised
                    if isinstance(raised, APIError)
                    else APIError(f"{self.scope}: {type(raised).__name__}: {raised}"[:512])
                )
                if not listed:
                    self.error = exc
                    self.tried.set()
                delay = self._jittered(backoff)
                log.warning(
                    "watch failed",
                    scope=self.scope,
                    reason=exc.reason,
                    error=str(exc),
                    retry_seconds=round(delay, 2),
                    exc_info=None if exc is raised else raised,
                )
                await asyncio.sleep(delay)
                backoff = min(BACKOFF_MAX, backoff * 2)

    def _jittered(self, backoff: float) -> float:
        return backoff * self._random.uniform(0.5, 1.0)  # "equal jitter": never 0

    def _lister(self) -> tuple[Callable[..., Awaitable[Any]], tuple[str, ...]]:
        """The list call for this scope and its positional arguments (a watch is the same
        call with ``watch=True``)."""
        group, version, plural = self._gvp
        if self._namespace is None:
            return self._custom.list_cluster_custom_object, (group, version, plural)
        return self._custom.list_namespaced_custom_object, (
            group,
            version,
            self._namespace,
            plural,
        )

    async def relist(self) -> str:
        """One LIST into the cache; the resourceVersion to watch from."""
        func, args = self._lister()
        found = await call(
            f"list {self.scope}",
            lambda: func(*args, label_selector=self._selector),
            self._timeout,
            self._gate,
        )
        items, version = list_of(found, f"list {self.scope}")
        self._items = {_key(obj): obj for obj in items}
        self.error = None
        self.synced.set()
        self.tried.set()
        return version

    async def _watch(self, since: str) -> str | None:
        """Apply one watch's events; the version to watch from next, or ``None`` to LIST."""
        func, args = self._lister()
        stream = watch.Watch()
        self.watches += 1
        heard = False
        try:
            async with stream.stream(
                func,
                *args,
                label_selector=self._selector,
                resource_version=since,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_SECONDS,
                _request_timeout=WATCH_SECONDS + self._timeout,
            ) as events:
                while (event := await self._next(events)) is not None:
                    heard = True
                    self._apply(event["type"], event["raw_object"])
        except ApiException as exc:
            if exc.status == 410:  # compacted: what we hold may have missed changes
                return None
            raise translate(exc, f"watch {self.scope}") from exc
        except (*API_EXCEPTIONS, TimeoutError) as exc:
            raise translate(exc, f"watch {self.scope}") from exc
        except APIError:
            raise
        except Exception as exc:  # the library's own: a line that is no watch event
            raise APIError(f"watch {self.scope}: {type(exc).__name__}: {exc}"[:512]) from exc
        if not heard:
            raise APIError(
                f"watch {self.scope}: ended having said nothing, not even a bookmark "
                "(a proxy that answers watches with an empty body?)"
            )
        return str(stream.resource_version or since)

    async def _next(self, events: Any) -> Json | None:
        """The watch's next event (``None``: it ended), within ``watch_idle``."""
        try:
            async with asyncio.timeout(self._idle):
                event = await anext(events)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            raise APIError(
                f"watch {self.scope}: no event or bookmark for {self._idle:g}s: dropped"
            ) from None
        if not isinstance(event, dict):  # the library hands on a line that is not JSON
            raise APIError(f"watch {self.scope}: a line that is not a watch event: {event[:64]!r}")
        return event

    def _apply(self, kind: str, obj: Json) -> None:
        if kind in ("ADDED", "MODIFIED"):
            self._items[_key(obj)] = obj
        elif kind == "DELETED":
            self._items.pop(_key(obj), None)


def _key(obj: Json) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


Scope = tuple[
    tuple[str, str, str], str | None, str
]  # (group, version, plural), namespace, selector


class Lister:
    """Objects of one kind in one scope: from that scope's informer, started on first use, or
    a LIST on every call when ``watch`` is off. The core group (``""``: Services) is read
    through ``core``."""

    def __init__(
        self,
        custom: client.CustomObjectsApi,
        api_timeout: float,
        watch: bool,
        gate: APIGate,
        idle: float = IDLE_SECONDS,
        core: CoreObjects | None = None,
    ) -> None:
        self._custom, self._timeout, self._watch, self._gate = custom, api_timeout, watch, gate
        self._core = core
        self._idle = idle
        self._informers: dict[Scope, Informer] = {}

    @property
    def informers(self) -> list[Informer]:
        return list(self._informers.values())

    async def list(
        self, gvp: tuple[str, str, str], namespace: str | None, selector: str
    ) -> list[Json]:
        """The objects, or the API failure a LIST would give. An informer's first LIST is
        awaited within the API timeout; while its LIST or watch fails, that failure is raised,
        so discovery keeps the last targets and reports the API unreadable."""
        objects = self._custom if gvp[0] else self._core
        if objects is None:
            raise ValueError(f"{gvp[2]}: the core group needs a Lister given core objects")
        if not self._watch:
            once = Informer(objects, gvp, namespace, selector, self._timeout, self._gate)
            await once.relist()
            return once.objects()
        informer = self._informers.get((gvp, namespace, selector))
        if informer is None:
            informer = Informer(
                objects, gvp, namespace, selector, self._timeout, self._gate, self._idle
            )
            self._informers[(gvp, namespace, selector)] = informer
            informer.start()
        if not informer.tried.is_set():  # its first LIST: wait for it, or for why it failed
            try:
                async with asyncio.timeout(self._timeout):
                    await informer.tried.wait()
            except TimeoutError:
                raise informer.error or APITimeoutError(
                    f"list {informer.scope}: no answer (timed out)"
                ) from None
        if informer.error is not None:
            raise informer.error
        return informer.objects()

    async def close(self) -> None:
        for informer in self._informers.values():
            await informer.stop()
        self._informers.clear()
