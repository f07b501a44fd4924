"""Pure: how much a sequence of published weights moved. One definition for the simulator's
scores and replay's summary: a reversal is a cluster's weight changing direction; the largest
step is the most any cluster's weight moved in one write (from what was held before the
first, an even split unless said)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Published = Sequence[tuple[float, Mapping[str, int]]]  # (when, the weights written)


def reversals(published: Published, names: Sequence[str]) -> int:
    count = 0
    for name in names:
        last_sign = 0
        previous: int | None = None
        for _, weights in published:
            value = weights[name]
            if previous is not None and value != previous:
                sign = 1 if value > previous else -1
                if last_sign and sign != last_sign:
                    count += 1
                last_sign = sign
            previous = value
    return count


def largest_step(
    published: Published, names: Sequence[str], first: Mapping[str, float] | None = None
) -> int:
    """``first``: what was held before the first write (an even split if not given)."""
    even = 100 / len(names)
    previous: dict[str, float] = {n: (first or {}).get(n, even) for n in names}
    largest = 0.0
    for _, weights in published:
        largest = max(largest, *(abs(weights[n] - previous[n]) for n in names))
        previous = {n: float(w) for n, w in weights.items()}
    return round(largest)
