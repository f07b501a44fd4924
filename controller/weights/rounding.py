"""Pure: real-valued shares → whole points, exactly summing to the total, deterministically."""

from __future__ import annotations

from collections.abc import Mapping

TOTAL = 100


def proportional(values: Mapping[str, float], total: int) -> dict[str, int]:
    """Integers in the same proportions as ``values`` that sum to exactly ``total``
    (largest remainder; ties by name). All-zero input stays all zero."""
    mass = sum(values.values())
    if mass <= 0:
        return dict.fromkeys(values, 0)
    exact = {n: v * total / mass for n, v in values.items()}
    ints = {n: int(v) for n, v in exact.items()}
    for name in sorted(exact, key=lambda n: (-(exact[n] - ints[n]), n))[
        : total - sum(ints.values())
    ]:
        ints[name] += 1
    return ints


def round_to_total(values: Mapping[str, float], floor: int, healthy: list[str]) -> dict[str, int]:
    """Integers summing to exactly 100 (largest remainder; ties by name, so deterministic).

    Only healthy clusters receive the rounding remainder, and none ends below the floor
    (float error can leave 1.9999 where 2 was meant)."""
    ints = {n: (int(v) if n in healthy else 0) for n, v in values.items()}
    short = TOTAL - sum(ints.values())
    by_remainder = sorted(healthy, key=lambda n: (-(values[n] - ints[n]), n))
    for name in by_remainder[: max(0, short)]:
        ints[name] += 1
    low = min(floor, TOTAL // len(healthy))
    for name in healthy:
        while ints[name] < low:
            donor = max(healthy, key=lambda n: (ints[n], n))
            ints[donor] -= 1
            ints[name] += 1
    return ints


def at_least(values: Mapping[str, int], minimum: int) -> dict[str, int]:
    """``values`` with none below ``minimum`` (the schema's lowest weight: on MaaS v0.2.0 a
    ref cannot be set to 0, so a dead cluster keeps 1), the points taken one at a time from
    the largest (ties by name), keeping the sum. The caller ensures the sum allows it."""
    result = dict(values)
    for name in sorted(result):
        while result[name] < minimum:
            donor = max(result, key=lambda n: (result[n], n))
            if result[donor] <= minimum:
                return result
            result[donor] -= 1
            result[name] += 1
    return result
