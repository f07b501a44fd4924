"""The engine table: each row reads its own engine's page exactly, found on the page."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.engines import AUTO, ENGINES, Family, spellings
from controller.errors import ConfigError
from controller.fakes.pages import engine_page
from controller.model import Reason
from controller.settings import build_settings
from controller.sources.page import POD_EXTRACTOR, Page, read_page
from controller.sources.reader import PageReader
from tests.support.engines import OWN, PAGES, WITH_LATENCY, Load, acme_page, sglang_page, vllm_page


def reader(engine: str = AUTO, model: str | None = None) -> PageReader:
    settings = build_settings(
        {
            "clusters": [
                {
                    "name": "c",
                    "vllm_urls": ["http://127.0.0.1/"],
                    "engine": engine,
                    "model_name": model,
                }
            ]
        }
    )
    return PageReader(settings.clusters[0], min_latency_requests=1)


def pages(texts: list[str]) -> list[Page]:
    read = [read_page(f"http://pod{i}/metrics", t, POD_EXTRACTOR) for i, t in enumerate(texts)]
    assert all(isinstance(p, Page) for p in read), read
    return [p for p in read if isinstance(p, Page)]


@pytest.mark.parametrize("engine", list(ENGINES))
def test_each_row_reads_its_engine_s_page_found_by_its_kv_family(engine: str) -> None:
    render = PAGES[engine]
    loads = [Load(kv=0.95, waiting=6, running=4, blocks=2000), Load(kv=0.85, waiting=6, running=2)]
    metrics = reader().read(pages([render(load) for load in loads]), None, 0.0, 0.0)
    assert metrics.errors == ()
    assert metrics.engine == engine
    assert metrics.kv_mean == pytest.approx(0.90) and metrics.kv_max == 0.95
    assert (metrics.queue_depth, metrics.running) == (12.0, 6.0)
    assert metrics.kv_tokens == (2000 + 10_000) * 16  # each pod's pool, read by its rule


@pytest.mark.parametrize("engine", WITH_LATENCY)
def test_latency_comes_from_each_engine_s_own_histogram(engine: str) -> None:
    read = reader()
    first = read.read(pages([PAGES[engine](Load(kv=0.5, completed=100))]), None, 0.0, 0.0)
    assert first.latency is None  # a baseline only
    then = read.read(pages([PAGES[engine](Load(kv=0.5, completed=160))]), None, 10.0, 0.0)
    assert then.latency is not None and then.latency.requests == 60
    assert then.latency.family == ENGINES[engine].latency


@pytest.mark.parametrize("engine", [e for e in ENGINES if e != "vllm"])
def test_a_named_engine_reads_only_its_own_row(engine: str) -> None:
    """A cluster that names vLLM does not read another engine's page: it says which names
    it looked for."""
    metrics = reader("vllm").read(pages([PAGES[engine](Load(kv=0.5))]), None, 0.0, 0.0)
    assert [e.reason for e in metrics.errors] == [Reason.MISSING_METRIC]
    assert "vllm:kv_cache_usage_perc" in metrics.errors[0].detail
    assert metrics.kv_mean is None
    named = reader(engine).read(pages([PAGES[engine](Load(kv=0.5))]), None, 0.0, 0.0)
    assert named.kv_mean == 0.5 and named.errors == ()


def test_sglang_priority_series_are_not_added_to_the_totals() -> None:
    """With priority scheduling SGLang writes the totals under priority="" and a series per
    priority beside them: only the totals count."""
    page = sglang_page(Load(kv=0.4, waiting=8, running=6, processes=2), priority=True)
    metrics = reader().read(pages([page]), None, 0.0, 0.0)
    assert (metrics.queue_depth, metrics.running, metrics.kv_mean) == (8.0, 6.0, 0.4)
    # two data-parallel schedulers, each with its own pool
    assert metrics.kv_tokens == 2 * 10_000 * 16


def test_a_cluster_of_two_engines_reads_each_pod_by_its_own() -> None:
    texts = [vllm_page(Load(kv=0.6, waiting=3)), sglang_page(Load(kv=0.2, waiting=1))]
    metrics = reader().read(pages(texts), None, 0.0, 0.0)
    assert metrics.engine == "sglang+vllm"
    assert metrics.kv_mean == pytest.approx(0.4) and metrics.queue_depth == 4.0


def test_the_model_filter_uses_each_engine_s_model_label() -> None:
    """Triton names the model in ``model``, the others in ``model_name``."""
    page = PAGES["triton-tensorrt-llm"](Load(kv=0.7, waiting=2), model="ensemble")
    assert reader(model="ensemble").read(pages([page]), None, 0.0, 0.0).kv_mean == 0.7
    other = reader(model="other").read(pages([page]), None, 0.0, 0.0)
    assert other.kv_mean is None and other.errors[0].reason == Reason.MISSING_METRIC


def test_every_colon_name_is_read_under_its_underscore_spelling_too() -> None:
    page = sglang_page(Load(kv=0.3, waiting=5), spelling="sglang_")
    metrics = reader().read(pages([page]), None, 0.0, 0.0)
    assert (metrics.engine, metrics.kv_mean, metrics.queue_depth) == ("sglang", 0.3, 5.0)
    assert spellings("a:b:c") == ["a:b:c", "a_b_c"] and spellings("x_y") == ["x_y"]


def test_a_pool_that_says_nothing_usable_leaves_capacity_unknown() -> None:
    """A pool rule that cannot be read (blocks not known yet, a fraction) is no pool: the
    cluster's capacity stays in pods rather than taking a wrong size."""
    text = PAGES["trtllm-serve"](Load(kv=0.5)).replace(
        "trtllm_kv_cache_max_blocks{engine_type", "trtllm_kv_cache_max_blocks_x{engine_type"
    )
    assert reader().read(pages([text]), None, 0.0, 0.0).kv_tokens is None
    half = PAGES["trtllm-serve"](Load(kv=0.5, block_size=16)).replace(" 16.0\n", " 16.5\n")
    assert reader().read(pages([half]), None, 0.0, 0.0).kv_tokens is None


def test_family_matchers_are_prometheus_matchers() -> None:
    family = Family(("x",), (("priority", ""), ("type", "fraction")))
    assert family.matches({"type": "fraction"})
    assert family.matches({"type": "fraction", "priority": ""})
    assert not family.matches({"type": "fraction", "priority": "1"})
    assert not family.matches({"type": "max"})
    assert str(family) == 'x{priority="",type="fraction"}'


def test_an_unknown_engine_is_refused_at_start_up_naming_the_field() -> None:
    with pytest.raises(ConfigError) as refused:
        build_settings(
            {"clusters": [{"name": "c", "vllm_urls": ["http://127.0.0.1/"], "engine": "tgi"}]}
        )
    assert "clusters[0].engine" in str(refused.value) and "'tgi' is not an engine" in str(
        refused.value
    )


# ---- engines of your own ---------------------------------------------------------------------


def own_reader(engine: str = AUTO) -> PageReader:
    settings = build_settings(
        {
            "engines": [OWN],
            "clusters": [{"name": "c", "vllm_urls": ["http://127.0.0.1/"], "engine": engine}],
        }
    )
    return PageReader(settings.clusters[0], 1, settings.engine_table())


@pytest.mark.parametrize("engine", [AUTO, "acme"])
def test_an_engine_of_your_own_is_read_by_its_row(engine: str) -> None:
    reader = own_reader(engine)
    text = acme_page(0.8, 3, 5)
    page = read_page("http://pod/metrics", text, reader.pod_extractor)
    assert isinstance(page, Page)
    metrics = reader.read([page], None, 0.0, 0.0)
    assert metrics.errors == () and metrics.engine == "acme"
    assert (metrics.kv_mean, metrics.queue_depth, metrics.running) == (0.8, 3.0, 5.0)
    assert metrics.kv_tokens == 32 * 1000


def test_the_default_templates_read_an_engine_of_your_own_and_keep_yours() -> None:
    own = build_settings(
        {
            "engines": [OWN],
            "clusters": [{"name": "c", "prometheus": {"url": "http://127.0.0.1:9/"}}],
            "prometheus_queries": {"kv_max": "max by ($by) (x$selector)"},
        }
    ).prometheus_queries
    assert '{__name__="acme_kv_blocks",kind="fraction"$selector}' in own.kv_mean
    assert '{__name__="vllm:kv_cache_usage_perc"$selector}' in own.kv_mean  # built-ins stay
    assert 'acme_batch",state="active"' in own.running
    assert "acme_request_seconds_bucket" in own.latency_quantile
    assert "ignoring(kind)" in own.kv_tokens
    assert own.kv_max == "max by ($by) (x$selector)"  # a template given is kept


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"kv": "acme_kv{kind}"}, "engines[0].kv: 'acme_kv{kind}': 'kind' is not"),
        ({"name": "sglang"}, "engines[0].name: 'sglang' is a built-in engine's"),
        ({"pool": {"tokens": "t", "block": "b", "count": "c"}}, "give exactly one of info"),
        ({"pool": {"block": "b"}}, "block and count go together"),
        ({"pool": {"info": "i"}}, "info needs block_label and count_label"),
        ({"latency": "x{a=b}"}, "engines[0].latency: String should match pattern"),
    ],
)
def test_an_engine_of_your_own_is_checked_at_start_up(
    change: dict[str, object], error: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        build_settings(
            {"engines": [{**OWN, **change}], "clusters": [{"name": "c", "epp_url": "http://x/"}]}
        )
    assert error in str(refused.value), str(refused.value)


def test_a_cluster_names_a_known_engine_and_names_are_unique() -> None:
    with pytest.raises(ConfigError) as refused:
        build_settings(
            {
                "engines": [OWN, OWN],
                "clusters": [{"name": "c", "vllm_urls": ["http://127.0.0.1/"], "engine": "acm"}],
            }
        )
    lines = str(refused.value).splitlines()
    assert "engines: names must be unique: acme" in lines
    assert any(
        line.startswith("clusters[0].engine: 'acm' is not an engine: auto,") for line in lines
    )


# ---- what a stranger's review of #41 found ---------------------------------------------------


def test_a_pool_no_gpu_holds_is_no_capacity_and_is_named() -> None:
    text = PAGES["trtllm-serve"](Load(kv=0.5, blocks=10**15))
    metrics = reader().read(pages([text]), None, 0.0, 0.0)
    assert metrics.kv_tokens is None and metrics.kv_mean == 0.5
    assert [(n.reason, "more than any pod" in n.detail) for n in metrics.notices] == [
        (Reason.OUT_OF_RANGE, True)
    ]


def test_the_pool_is_the_named_model_s_own() -> None:
    """A Triton server of two models: the cluster's model's pool, not both (51x too much)."""
    a = PAGES["triton-tensorrt-llm"](Load(kv=0.9, blocks=1000), model="a")
    b = PAGES["triton-tensorrt-llm"](Load(kv=0.1, blocks=50_000), model="b")
    both = a + "".join(line + "\n" for line in b.splitlines() if not line.startswith("#"))
    metrics = reader(model="a").read(pages([both]), None, 0.0, 0.0)
    assert (metrics.kv_mean, metrics.kv_tokens) == (0.9, 1000 * 16)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_url_in_front_of_two_pods_is_named_for_every_engine(engine: str) -> None:
    """One URL answering as two processes, each with its own count of completed requests:
    named load_balanced for Triton too, which has no latency histogram (its own counter,
    nv_inference_request_success, says it)."""
    read, reasons = reader(), []
    for tick in range(8):
        load = Load(kv=0.9 if tick % 2 else 0.1, completed=1000 + tick if tick % 2 else 10 + tick)
        page = read_page("http://svc/metrics", PAGES[engine](load), POD_EXTRACTOR)
        assert isinstance(page, Page)
        reasons += [e.reason for e in read.read([page], None, float(tick), 0.0).errors]
    assert Reason.LOAD_BALANCED in reasons


@pytest.mark.parametrize("engine", list(ENGINES))
def test_the_fakes_render_each_row_as_the_reader_reads_it(engine: str) -> None:
    """The simulator's and the demo's pages (``fakes.pages.engine_page``): one server of each
    row, a Ray node of one replica for ``ray-vllm``, read back exactly."""
    row = ENGINES[engine]
    text = engine_page(row, "m", 0.75, 3, 2, blocks=1000, block_size=16, replica="r-7")
    metrics = reader(model="m").read(pages([text]), None, 0.0, 0.0)
    assert metrics.errors == () and metrics.engine == engine
    assert (metrics.kv_mean, metrics.queue_depth, metrics.running) == (0.75, 3.0, 2.0)
    assert metrics.kv_tokens == 16_000
    assert metrics.replicas == (1 if row.replica_label else None)


def test_a_row_s_dollar_is_text_on_a_page_and_in_a_query() -> None:
    """A matcher value with a ``$`` (refused as an unknown placeholder until an audit found
    it) reads the page's literal value and goes into the templates as ``$$``, which renders
    to the ``$`` itself."""
    row = {"name": "zeta", "kv": 'zeta_kv{kind="fr$ction"}', "waiting": "zq", "running": "zr"}
    settings = build_settings(
        {"engines": [row], "clusters": [{"name": "c", "vllm_urls": ["http://127.0.0.1/"]}]}
    )
    assert 'kind="fr$$ction"' in settings.prometheus_queries.kv_mean
    reader = PageReader(settings.clusters[0], 1, settings.engine_table())
    text = 'zeta_kv{kind="fr$ction"} 0.4\nzq 2\nzr 3\n'
    page = read_page("http://pod/metrics", text, reader.pod_extractor)
    assert isinstance(page, Page)
    metrics = reader.read([page], None, 0.0, 0.0)
    assert (metrics.engine, metrics.kv_mean, metrics.queue_depth) == ("zeta", 0.4, 2.0)


def test_the_readme_s_engine_table_has_a_line_for_each_row_as_the_row_is() -> None:
    """controller/README.md's engine table is written by hand (names shortened where a
    column repeats a prefix); each built-in row has its line there, with its KV family's
    first name (and matchers), its latency histogram and its model label as the row has them
    (found by an audit of #41: nothing held the table to the rows)."""
    readme = (Path(__file__).parents[2] / "controller" / "README.md").read_text()
    lines = {
        line.split("|")[1].strip().strip("`"): line
        for line in readme.splitlines()
        if line.startswith("| `")
    }
    for name, engine in ENGINES.items():
        line = lines.get(name)
        assert line is not None, f"no line for {name} in controller/README.md's engine table"
        first = engine.kv.names[0]
        matchers = ",".join(f'{k}="{v}"' for k, v in engine.kv.match)
        assert f"`{first}{{{matchers}}}`" in line if matchers else f"`{first}`" in line, name
        assert f"`{engine.latency}`" in line if engine.latency else "| — |" in line, name
        assert f"| `{engine.model_label}` |" in line, name


def test_a_negative_count_is_no_count_by_page_and_by_promql() -> None:
    """Found by an attack: a page's vllm:num_requests_waiting of -6 went into the queue, and
    under the integral law its penalty became a complex number and every tick raised."""
    from controller.sources.answers import Answers, Asked, cluster_metrics

    settings = build_settings({"clusters": [{"name": "c", "vllm_urls": ["http://127.0.0.1/"]}]})
    reader = PageReader(settings.clusters[0], 1)
    text = (
        'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'
        'vllm:num_requests_waiting{engine="0"} -6\n'
        'vllm:num_requests_running{engine="0"} -1\n'
    )
    page = read_page("http://pod/metrics", text, reader.pod_extractor)
    assert isinstance(page, Page)
    metrics = reader.read([page], None, 0.0, 0.0)
    assert (metrics.kv_mean, metrics.queue_depth, metrics.running) == (0.5, None, None)
    asked = Asked("http://hub", "cluster", "c", {"kv_mean": "q"}, 60.0, 5.0)
    answers: Answers = {
        "kv_mean": {"c": 0.5},
        "kv_max": {"c": 0.5},
        "pods": {"c": 1.0},
        "queue": {"c": -3.0},
        "running": {"c": float("nan")},
    }
    read = cluster_metrics("c", answers, asked, 0.0, 0.0, None)
    assert (read.kv_mean, read.queue_depth, read.running) == (0.5, None, None)
    # a review: a count no cluster holds (1e300) is none by page too, as by PromQL
    huge = text.replace("} -6", "} 1e300").replace("} -1", "} 5")
    page = read_page("http://pod/metrics", huge, reader.pod_extractor)
    assert isinstance(page, Page)
    metrics = reader.read([page], None, 0.0, 0.0)
    assert (metrics.queue_depth, metrics.running) == (None, 5.0)


def test_the_integral_law_s_shape_is_bounded_where_its_arithmetic_is_finite() -> None:
    """Found by an attack: gain 1e308 (and kv_exponent, queue_reference, the sensitivities
    at their extremes) passed check-config, then every tick's weighing overflowed."""
    for key, value in (
        ("gain", 1e308),
        ("kv_exponent", 1e308),
        ("kv_exponent", 1e-300),
        ("queue_reference", 1e-300),
        ("queue_sensitivity", 1000.0),
        ("latency_sensitivity", 1000.0),
    ):
        with pytest.raises(ConfigError, match=f"weights.{key}"):
            build_settings(
                {
                    "weights": {"law": "integral", key: value},
                    "clusters": [{"name": "c", "vllm_urls": ["http://127.0.0.1/"]}],
                }
            )


def test_numbers_past_a_float_s_range_are_named_not_internal() -> None:
    """Found by an attack: one pod's cache_config_info with a 400-digit num_gpu_blocks raised
    OverflowError and failed its whole cluster as internal; a querier's answer with a JSON
    integer of 400 digits, or nested past the parser's depth, failed every cluster of the
    querier as internal. Now: that pod's pool is out of range by name, that query a parse
    error."""
    from controller.errors import FetchParseError
    from controller.sources.prometheus import answer_series, matrix_series, range_answers

    settings = build_settings({"clusters": [{"name": "c", "vllm_urls": ["http://127.0.0.1/"]}]})
    reader = PageReader(settings.clusters[0], 2)
    huge = "9" * 400
    texts = [
        f'vllm:kv_cache_usage_perc{{engine="0"}} 0.5\n'
        f'vllm:cache_config_info{{block_size="16",engine="0",num_gpu_blocks="{blocks}"}} 1\n'
        for blocks in (huge, "1000")
    ]
    pages = [
        read_page(f"http://pod{i}/metrics", t, reader.pod_extractor) for i, t in enumerate(texts)
    ]
    assert all(isinstance(p, Page) for p in pages)
    metrics = reader.read(pages, None, 0.0, 0.0)
    assert metrics.kv_mean == 0.5 and [e.reason for e in metrics.errors] == []
    assert [n.reason for n in metrics.notices] == [Reason.OUT_OF_RANGE]
    body = (
        '{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"cluster":"c"},'
        f'"values":[[100,{huge}]]}}]}}}}'
    )
    deep = '{"status":"success","data":' + "[" * 100_000 + "]" * 100_000 + "}"
    for answer in (body, deep):
        with pytest.raises(FetchParseError):
            matrix_series(answer, "u")
        with pytest.raises(FetchParseError):
            range_answers("queue", answer, [100.0], "cluster", "u")
    vector = (
        '{"status":"success","data":{"resultType":"vector","result":[{"metric":{"cluster":"c"},'
        f'"value":[100,{huge}]}}]}}}}'
    )
    with pytest.raises(FetchParseError):
        answer_series(vector, "u")


def test_counts_that_sum_past_a_float_s_range_are_unknown_not_infinite() -> None:
    """Found by an attack: two pods each waiting 1.7e308 summed to infinity, the utilization
    made of it was NaN (never under pressure), and /debug/state carried NaN and Infinity."""
    settings = build_settings(
        {"clusters": [{"name": "c", "vllm_urls": ["http://127.0.0.1/", "http://127.0.0.2/"]}]}
    )
    reader = PageReader(settings.clusters[0], 1)
    text = (
        'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'
        'vllm:num_requests_waiting{engine="0"} 1.7e308\n'
        'vllm:num_requests_running{engine="0"} 1.7e308\n'
        'vllm:num_requests_running{engine="1"} 1.7e308\n'
    )
    pages = [read_page(f"http://pod{i}/metrics", text, reader.pod_extractor) for i in range(2)]
    assert all(isinstance(p, Page) for p in pages)
    metrics = reader.read(pages, None, 0.0, 0.0)
    assert metrics.kv_mean == 0.5 and (metrics.queue_depth, metrics.running) == (None, None)


def test_an_instant_answer_s_value_that_is_not_a_string_is_malformed() -> None:
    """Found by an attack: a querier answering ``true`` for a value was read as KV 1.0; the
    query API writes every value as a string."""
    from controller.errors import FetchParseError
    from controller.sources.prometheus import answer_series

    for value in ("true", "1", "null"):
        body = (
            '{"status":"success","data":{"resultType":"vector","result":[{"metric":{"c":"a"},'
            f'"value":[100,{value}]}}]}}}}'
        )
        with pytest.raises(FetchParseError, match="not a string"):
            answer_series(body, "u")
    fine = body.replace("null", '"0.5"')
    assert answer_series(fine, "u") == [({"c": "a"}, 0.5)]
