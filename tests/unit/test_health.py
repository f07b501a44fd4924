"""The health state machine: hysteresis both ways, explicit reasons, staleness."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from controller.health import failure_reason, judge
from controller.model import ClusterHealth, ClusterMetrics, PodError, Reason
from controller.settings import HealthSettings

H = HealthSettings()
NOW = 1_000_000.0


def good(now: float = NOW, **kw: object) -> ClusterMetrics:
    fields: dict[str, object] = {
        "pods_scraped": 2,
        "pods_answering": 2,
        "kv_mean": 0.3,
        "kv_max": 0.4,
    }
    fields.update(kw)
    return ClusterMetrics(cluster="a", scraped_at=now, duration=0.01, **fields)  # type: ignore[arg-type]


def bad(reason: Reason = Reason.HTTP_STATUS, now: float = NOW) -> ClusterMetrics:
    return ClusterMetrics.failed("a", now, reason, "boom", 0.01)


def run(
    fetches: Iterable[ClusterMetrics], start: ClusterHealth | None = None
) -> list[ClusterHealth]:
    states = []
    state = start
    for metrics in fetches:
        state = judge(state, metrics, H, metrics.scraped_at)
        states.append(state)
    return states


@pytest.mark.parametrize(
    ("metrics", "reason"),
    [
        (good(), None),
        (bad(Reason.CONNECT), Reason.CONNECT),
        (good(kv_mean=None, kv_max=None), Reason.MISSING_METRIC),
        (good(pods_scraped=0, pods_answering=0), Reason.NO_PODS),
        (
            good(
                pods_scraped=3,
                pods_answering=1,
                errors=(
                    PodError("u1", Reason.HTTP_STATUS, "500"),
                    PodError("u2", Reason.HTTP_STATUS, "503"),
                ),
            ),
            Reason.HTTP_STATUS,
        ),
        (good(observed_at=NOW - 120), Reason.STALE),
        # a sample stamped an hour ahead never aged, so it never went stale
        (good(observed_at=NOW - 1, observed_newest=NOW + 3600), Reason.STALE),
        (good(observed_at=NOW - 1, observed_newest=NOW + 2), None),  # clocks a little apart
    ],
)
def test_failure_reasons_are_explicit(metrics: ClusterMetrics, reason: Reason | None) -> None:
    assert failure_reason(metrics, H, NOW) == reason


def test_some_pods_failing_is_usable_but_degraded() -> None:
    metrics = good(
        pods_scraped=3, pods_answering=2, errors=(PodError("u", Reason.TIMEOUT, "slow"),)
    )
    (state,) = run([metrics])
    assert state.healthy and state.degraded and state.reason is None


def test_first_good_fetch_is_healthy_first_bad_is_unhealthy() -> None:
    assert run([good()])[0].healthy
    first = run([bad(Reason.TIMEOUT)])[0]
    assert not first.healthy and first.reason is Reason.TIMEOUT


def test_one_failure_is_a_blip_two_is_an_outage_and_signals_are_held() -> None:
    states = run([good(), bad(now=NOW + 10), bad(now=NOW + 20)])
    assert states[1].healthy and states[1].reason is Reason.HTTP_STATUS
    assert states[1].metrics is not None and states[1].metrics.kv_mean == 0.3
    assert not states[2].healthy and states[2].changed and states[2].metrics is None


def test_recovery_needs_consecutive_successes() -> None:
    states = run([good(), bad(), bad(), good(), bad(), good(), good()])
    assert [s.healthy for s in states] == [True, True, False, False, False, False, True]
    assert states[-1].changed


def timeouts(n: int, start: float = NOW + 10) -> list[ClusterMetrics]:
    return [bad(Reason.TIMEOUT, now=start + 10 * i) for i in range(n)]


def test_timeouts_alone_are_ridden_out_longer_than_error_pages() -> None:
    """A cluster that answered a moment ago and then times out may be serving behind a slow
    path to its metrics: it keeps its last reading for ``timeouts_to_unhealthy`` fetches."""
    states = run([good(), *timeouts(H.timeouts_to_unhealthy)])
    assert H.timeouts_to_unhealthy > H.failures_to_unhealthy
    assert all(s.healthy and s.reason is Reason.TIMEOUT for s in states[1:-1])
    assert all(s.metrics is not None and s.metrics.kv_mean == 0.3 for s in states[1:-1])
    last = states[-1]
    assert not last.healthy and last.changed and last.reason is Reason.TIMEOUT
    assert (last.failures, last.timeouts) == (H.timeouts_to_unhealthy,) * 2


@pytest.mark.parametrize(
    "fetches",
    [
        # an error page between timeouts is still the second bad sign of trouble
        [bad(Reason.HTTP_STATUS, NOW + 10), bad(Reason.TIMEOUT, NOW + 20), bad(now=NOW + 30)],
        [bad(Reason.TIMEOUT, NOW + 10), bad(now=NOW + 20), bad(Reason.PARSE, NOW + 30)],
    ],
)
def test_error_pages_among_timeouts_count_as_they_do_alone(fetches: list[ClusterMetrics]) -> None:
    states = run([good(), *fetches])
    assert [s.healthy for s in states] == [True, True, True, False]


def test_a_timeout_beside_a_refusal_is_not_a_path_fault() -> None:
    """Only a fetch whose every page timed out counts as a timeout."""
    mixed = refusing(Reason.TIMEOUT, Reason.HTTP_STATUS, now=NOW + 10)
    states = run([good(), mixed, refusing(Reason.TIMEOUT, Reason.HTTP_STATUS, now=NOW + 20)])
    assert states[1].healthy and states[1].timeouts == 0
    assert not states[2].healthy


def test_a_good_fetch_clears_the_timeouts() -> None:
    states = run([good(), *timeouts(4), good(NOW + 50), *timeouts(4, NOW + 60)])
    assert all(s.healthy for s in states)
    assert states[5].timeouts == 0 and states[-1].timeouts == 4


def test_timeouts_hold_the_last_reading_only_while_it_is_fresh() -> None:
    short = HealthSettings(max_staleness=25)
    state = judge(None, good(), short, NOW)
    for at in (NOW + 10, NOW + 20):
        state = judge(state, bad(Reason.TIMEOUT, at), short, at)
        assert state.healthy
    state = judge(state, bad(Reason.TIMEOUT, NOW + 30), short, NOW + 30)
    assert not state.healthy and state.reason is Reason.STALE


def test_timeouts_may_not_be_stronger_evidence_than_errors() -> None:
    with pytest.raises(ValueError, match="timeouts_to_unhealthy \\(2\\) is below"):
        HealthSettings(failures_to_unhealthy=3, timeouts_to_unhealthy=2)


def test_stale_data_is_unhealthy_at_once() -> None:
    states = run([good(), good(now=NOW + 10, observed_at=NOW - 100)])
    assert not states[1].healthy and states[1].reason is Reason.STALE


def test_held_signals_go_stale() -> None:
    short = HealthSettings(failures_to_unhealthy=5, max_staleness=15)
    state = judge(None, good(), short, NOW)
    state = judge(state, bad(now=NOW + 10), short, NOW + 10)
    assert state.healthy
    state = judge(state, bad(now=NOW + 20), short, NOW + 20)
    assert not state.healthy and state.reason is Reason.STALE


def refusing(*reasons: Reason, now: float = NOW) -> ClusterMetrics:
    errors = tuple(PodError(f"u{i}", r, "x") for i, r in enumerate(reasons))
    return ClusterMetrics("a", now, 0.01, len(reasons), 0, errors=errors)


@pytest.mark.parametrize(
    ("failing", "healthy_after_one"),
    [
        ((Reason.REFUSED, Reason.REFUSED), False),  # nothing listens: every request would fail
        ((Reason.TIMEOUT, Reason.TIMEOUT), True),  # may be a slow network: wait
        ((Reason.REFUSED, Reason.TIMEOUT), True),  # one pod may only be slow
    ],
)
def test_a_cluster_whose_every_pod_refuses_leaves_at_once(
    failing: tuple[Reason, ...], healthy_after_one: bool
) -> None:
    first, after = run([good(NOW), refusing(*failing, now=NOW + 10)])
    assert first.healthy
    assert after.healthy is healthy_after_one
    if not healthy_after_one:
        assert after.reason is Reason.REFUSED and after.changed


def test_a_page_stamped_in_the_future_reads_as_stale() -> None:
    """Through the real page reader: the sample's own millisecond timestamp, an hour ahead."""
    from controller.settings import ClusterSettings
    from controller.sources.page import POD_EXTRACTOR, Page, read_page
    from controller.sources.reader import PageReader

    ahead = int((NOW + 3600) * 1000)
    text = f'vllm:kv_cache_usage_perc{{engine="0"}} 0.4 {ahead}\n'
    page = read_page("http://pod/metrics", text, POD_EXTRACTOR)
    assert isinstance(page, Page)
    cluster = ClusterSettings(name="a", vllm_urls=["http://pod/metrics"])
    metrics = PageReader(cluster, 5).read([page], None, NOW, 0.01)
    assert metrics.observed_newest == NOW + 3600
    assert failure_reason(metrics, H, NOW) is Reason.STALE
