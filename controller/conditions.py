"""Conditions that persist (an API server that stays down, a ref that maps to nothing, a target
frozen in fail static), logged when they start, now and then while they last, and when they
end: one line per change, not per tick."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class _Open:
    event: str
    since: float
    logged: float
    occurrences: int = 1
    fields: dict[str, Any] = field(default_factory=dict)


class Conditions:
    """Conditions that persist (an API server that stays down, a ref that maps to nothing, a
    target frozen in fail static): logged when they start, then at most every ``repeat``
    seconds with ``occurrences`` and ``since_seconds``, and once when they end
    (``condition ended``, with ``duration_seconds``). One line per change, not per tick."""

    def __init__(
        self,
        logger: Any,
        repeat: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._repeat = repeat
        self._clock = clock
        self._open: dict[Hashable, _Open] = {}

    def active(self, key: Hashable) -> bool:
        return key in self._open

    def observe(
        self,
        event: str,
        key: Hashable,
        level: str = "warning",
        once: bool = False,
        renew: bool = False,
        **fields: Any,
    ) -> None:
        """The condition ``key`` holds now; log ``event`` if it just started or is due again
        (``once``: only when it starts, for a condition that is one line while it lasts;
        ``renew``: another event or other fields under ``key`` end the one open and start
        their own, for a condition whose every change is news)."""
        now = self._clock()
        found = self._open.get(key)
        # an exception is logged once, never held: its frames would live as long as the condition
        kept = {k: v for k, v in fields.items() if k != "exc_info"}
        if renew and found is not None and (found.event, found.fields) != (event, kept):
            self.clear(key)
            found = None
        if found is None:
            self._open[key] = _Open(event, now, now, 1, kept)
            getattr(self._log, level)(event, **fields)
            return
        found.occurrences += 1
        found.fields = kept
        if not once and now - found.logged >= self._repeat:
            found.logged = now
            getattr(self._log, level)(  # one traceback per condition is enough
                event,
                **kept,
                repeated=True,
                occurrences=found.occurrences,
                since_seconds=round(now - found.since, 3),
            )

    def clear(self, key: Hashable) -> None:
        """The condition ``key`` no longer holds: log its end, if it was open."""
        found = self._open.pop(key, None)
        if found is None:
            return
        self._log.info(
            "condition ended",
            condition=found.event,
            **{k: v for k, v in found.fields.items() if k in _IDENTIFYING},
            duration_seconds=round(self._clock() - found.since, 3),
            occurrences=found.occurrences,
        )

    def retain(self, prefix: tuple[Hashable, ...], keep: AbstractSet[Hashable]) -> None:
        """End every open condition whose key (a tuple) starts with ``prefix`` and is not in
        ``keep``: for checks that run as a whole, such as one discovery or one fetch."""
        width = len(prefix)
        for key in [k for k in self._open if isinstance(k, tuple) and k[:width] == prefix]:
            if key not in keep:
                self.clear(key)


# Keys that say *what* a condition was about; its end line repeats them, nothing else.
_IDENTIFYING = frozenset(
    {"target", "cluster", "ref", "pod", "provider", "route", "identity", "problem", "changed_by"}
)
