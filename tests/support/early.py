"""The simulator's runs, started as soon as the session knows a test will need them.

``tests/unit/test_simulation.py`` holds the shipped defaults to their targets over about 180
seeded runs: some 100 CPU-seconds. The tests collected before it (integration, process) spend
most of their time waiting on sockets and child processes, so the runs start when collection
ends, in two worker processes at a lower priority: they take the cycles those tests leave idle
and yield the rest. The module fixture that needs them takes back what has not begun by then
and runs it at once.

A test module takes part by naming its runs ``JOBS`` and asking for them through a fixture
called ``runs`` that returns ``EARLY.outcomes(JOBS)``. Each run is seeded and alone in its
process, so where and when it runs changes nothing it returns.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported when a session asks for runs: 0.3 s every other session saves
    from controller.simulation.report import Job, Outcome

WORKERS = 2
NICE = 10  # CFS weight 110 against the tests' 1024: about a tenth of a contended core


def _lower_priority() -> None:
    os.nice(NICE)


class Early:
    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._futures: dict[Job, Future[Outcome]] = {}

    def start(self, items: Iterable[pytest.Item]) -> None:
        """Start the runs of every module an item of this session asks them of."""
        jobs: dict[Job, None] = {}
        for item in items:
            if "runs" in getattr(item, "fixturenames", ()):
                jobs.update(dict.fromkeys(getattr(item.module, "JOBS", ())))  # type: ignore[attr-defined]
        if not jobs:
            return
        from controller.simulation.report import run_in_process

        self._pool = ProcessPoolExecutor(max_workers=WORKERS, initializer=_lower_priority)
        self._futures = {job: self._pool.submit(run_in_process, job) for job in jobs}

    def outcomes(self, jobs: Sequence[Job]) -> list[Outcome]:
        """The runs' outcomes, in order. Runs the early start has not begun are taken back and
        run now at the tests' own priority: the session is waiting on them, and at a lower one
        any other load on the machine would starve them."""
        from controller.simulation.report import run_all

        if not all(job in self._futures for job in jobs):
            return run_all(jobs, workers=WORKERS)
        taken = [job for job in jobs if self._futures[job].cancel()]
        now = dict(zip(taken, run_all(taken, workers=WORKERS), strict=True)) if taken else {}
        return [now[job] if job in now else self._futures[job].result() for job in jobs]

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)  # a session cut short
            self._pool = None


EARLY = Early()
