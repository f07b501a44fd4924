"""Pure: what both laws share about moving from the weights in force — who must move at once,
what counts as no move, and a capped step that keeps the sum."""

from __future__ import annotations

from collections.abc import Mapping

from controller.weights.rounding import TOTAL


def survivors(previous: Mapping[str, int], healthy: list[str]) -> dict[str, float] | None:
    """The weights in force with unhealthy clusters' share handed to the healthy ones in
    proportion to what they carry; ``None`` if no healthy cluster carries anything."""
    carried = sum(previous[n] for n in healthy)
    if carried <= 0:
        return None
    result = dict.fromkeys(previous, 0.0)
    for name in healthy:
        result[name] = previous[name] * TOTAL / carried
    return result


def forced(previous: Mapping[str, int], healthy: list[str], floor: int) -> bool:
    """A change that must be published whatever its size: an unhealthy cluster still has
    traffic, or a healthy one is below its floor (a recovered one at 0, or weights set by hand)."""
    if any(previous[n] > 0 for n in previous if n not in healthy):
        return True
    low = min(floor, TOTAL // len(healthy))
    return any(previous[n] < low for n in healthy)


def within(previous: Mapping[str, int], other: Mapping[str, float], deadband: int) -> bool:
    """``other`` is less than ``deadband`` from ``previous`` everywhere: not worth a write."""
    return max(abs(other[n] - previous[n]) for n in previous) < deadband


def capped(
    base: Mapping[str, float],
    delta: Mapping[str, float],
    cap: float,
    gain_caps: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """``base`` moved by ``delta`` (which sums to 0), each move at most ``cap`` (a gain at
    most ``gain_caps[n]`` where given), keeping the sum: where capping cut one side, the other
    side is shrunk to match."""
    up = gain_caps or {}
    delta = {n: max(-cap, min(up.get(n, cap), d)) for n, d in delta.items()}
    gains = sum(d for d in delta.values() if d > 0)
    losses = -sum(d for d in delta.values() if d < 0)
    # Capping broke the zero sum; shrink the larger side so the total stays 100.
    if gains > losses:
        delta = {n: d * losses / gains if d > 0 else d for n, d in delta.items()}
    elif losses > gains:
        delta = {n: d * gains / losses if d < 0 else d for n, d in delta.items()}
    return {n: base[n] + delta[n] for n in base}


def with_floor(values: Mapping[str, float], healthy: list[str], floor: int) -> dict[str, float]:
    """Lift healthy clusters below the floor, taking from the others' excess over it."""
    low = min(float(floor), TOTAL / len(healthy))
    result = dict(values)
    deficit = sum(max(0.0, low - result[n]) for n in healthy)
    if deficit <= 0:
        return result
    excess = {n: result[n] - low for n in healthy if result[n] > low}
    spare = sum(excess.values())
    for name in healthy:
        if name in excess:
            result[name] -= deficit * excess[name] / spare
        else:
            result[name] = low
    return result
