"""Settings: the documented example, environment overrides, and clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from controller.cli import _parser
from controller.errors import ConfigError
from controller.settings import Settings, build_settings, load_settings
from controller.sources.prometheus import queries_for
from tests.integration.test_secure_metrics import self_signed

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = """\
interval: 10s
clusters:
  - name: cluster-b
    vllm_urls: ["http://127.0.0.1:18001/metrics", "http://127.0.0.1:18002/metrics"]
  - name: cluster-c
    vllm_urls: ["http://127.0.0.1:18003/metrics"]
    epp_url: "http://127.0.0.1:19003/metrics"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_minimal_shape_from_the_issue_works(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, MINIMAL))
    assert settings.interval == 10.0
    assert [c.name for c in settings.clusters] == ["cluster-b", "cluster-c"]
    assert str(settings.clusters[1].epp_url) == "http://127.0.0.1:19003/metrics"
    assert settings.server.bind == "0.0.0.0:8080"


def test_example_documents_every_field_with_its_default() -> None:
    example = yaml.safe_load((ROOT / "config" / "example.yaml").read_text())
    settings = load_settings(ROOT / "config" / "example.yaml")
    defaults = Settings(clusters=[{"name": "x", "vllm_urls": ["http://127.0.0.1/"]}])
    groups = (
        "scrape",
        "health",
        "weights",
        "server",
        "log",
        "prometheus_queries",
        "kubernetes",
        "leader_election",
    )
    for group in groups:
        documented = example[group]
        assert set(documented) == set(type(getattr(defaults, group)).model_fields), group
        if group == "prometheus_queries":  # built from the engine table: say what to paste
            default = defaults.prometheus_queries.model_dump()
            changed = {k: v for k, v in default.items() if documented.get(k) != v}
            assert not changed, "config/example.yaml prometheus_queries:\n" + yaml.safe_dump(
                changed, width=10_000
            )
        assert getattr(settings, group) == getattr(defaults, group), group
    assert set(example["clusters"][1]) == set(type(settings.clusters[0]).model_fields)
    prometheus = settings.clusters[2].prometheus
    assert prometheus is not None
    assert set(example["clusters"][2]["prometheus"]) == set(type(prometheus).model_fields)


@pytest.mark.parametrize("zero", ["0", "0s", "0ms"])
def test_off_is_written_as_any_duration_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zero: str
) -> None:
    """Found by an attack: ``settle: 0`` ("never wait", documented) and the default
    ``forecast_horizon: 0`` were refused as strings, the environment's only form."""
    monkeypatch.setenv("WEIGHT_CONTROLLER_CONFIG", str(write(tmp_path, MINIMAL)))
    monkeypatch.setenv("WEIGHT_CONTROLLER_WEIGHTS__SETTLE", zero)
    monkeypatch.setenv("WEIGHT_CONTROLLER_WEIGHTS__FORECAST_HORIZON", zero)
    settings = load_settings()
    assert (settings.settle, settings.weights.forecast_horizon) == (0.0, 0.0)


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIGHT_CONTROLLER_CONFIG", str(write(tmp_path, MINIMAL)))
    monkeypatch.setenv("WEIGHT_CONTROLLER_INTERVAL", "20s")
    monkeypatch.setenv("WEIGHT_CONTROLLER_WEIGHTS__FLOOR", "5")
    monkeypatch.setenv("WEIGHT_CONTROLLER_SCRAPE__TIMEOUT", "500ms")
    settings = load_settings()
    assert (settings.interval, settings.weights.floor, settings.scrape.timeout) == (20.0, 5, 0.5)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("interval: 10s\nclusters: []\n", "clusters: List should have at least 1 item"),
        ("interval: soon\n" + MINIMAL.split("\n", 1)[1], "interval: not a duration: 'soon'"),
        (
            "interval: 2s\nscrape: {timeout: 5s}\n" + MINIMAL.split("\n", 1)[1],
            "scrape.timeout: must be shorter than interval",
        ),
        (
            "clusters:\n  - name: Bad_Name\n    vllm_urls: [x]\n",
            "clusters[0].name: String should match pattern",
        ),
        (
            "clusters:\n  - name: a\n    vllm_urls: [nope]\n",
            "clusters[0].vllm_urls[0]: Input should be a valid URL",
        ),
        (
            "clusters:\n  - name: a\n",
            "clusters[0]: needs vllm_urls, pods, epp_url, inference_pool or prometheus",
        ),
        (
            "clusters:\n  - name: a\n    epp_url: http://127.0.0.1/\n    prometheus: {url: http://127.0.0.1:9090}\n",
            "use either prometheus or vllm_urls/pods/epp_url",
        ),
        (
            "clusters:\n  - name: a\n    prometheus: {url: http://127.0.0.1:9090, matchers: {bad-name: x}}\n",
            "not a label name",
        ),
        (
            MINIMAL + "weights: {floor: -1}\n",
            "weights.floor: Input should be greater than or equal to 0",
        ),
        (MINIMAL + "weights: {flor: 3}\n", "weights.flor: Extra inputs are not permitted"),
        (MINIMAL + "weights: {deadband: 30}\n", "deadband must be smaller than max_step"),
        (MINIMAL + "server: {bind: 'localhost'}\n", "server.bind: expected host:port"),
        (MINIMAL.replace("cluster-c", "cluster-b"), "clusters: names must be unique: cluster-b"),
        ("- just\n- a list\n", "the top level must be a mapping"),
        ("clusters: [\n", "not valid YAML"),
        # a second clusters: list silently dropped the first
        (
            MINIMAL + "clusters:\n  - {name: z, vllm_urls: ['http://z:1/']}\n",
            "duplicate key 'clusters' (first on line 2)",
        ),
        (MINIMAL + "scrape: {timeout: 1s, timeout: 2s}\n", "duplicate key 'timeout'"),
        ("interval: 1ms\n" + MINIMAL.split("\n", 1)[1], "interval: 0.001s is outside 100ms..1h"),
        ("interval: 99999999h\n" + MINIMAL.split("\n", 1)[1], "is outside 100ms..1h"),
        # found by an attack on check-config, each accepted and then tripped on at run time
        ("clusters: 5\n", "clusters: Input should be a valid list"),  # was a TypeError
        (MINIMAL + "engines: 5\n", "engines: Input should be a valid list"),
        (
            MINIMAL + "kubernetes: {httproutes: 5}\n",
            "kubernetes.httproutes: Input should be a valid list",
        ),
        ("interval: on\n" + MINIMAL.split("\n", 1)[1], "interval: not a duration: True"),
        (MINIMAL + "weights: {settle: yes}\n", "weights.settle: not a duration: True"),
        (
            "interval: 2s\nhealth: {max_staleness: 1s}\n" + MINIMAL.split("\n", 1)[1],
            "health.max_staleness: 1s must be longer than interval (2s)",
        ),
        (
            "interval: 1s\nqueriers: [{name: hub, url: 'http://127.0.0.1:1/', timeout: 1h}]\n"
            "clusters: [{name: a, prometheus: {querier: hub}}]\n",
            "queriers[0].timeout: must be shorter than interval",
        ),
        (
            "queriers: [{name: hub, url: 'http://127.0.0.1:1/'}]\nclusters:\n"
            "  - {name: east, prometheus: {querier: hub}}\n"
            "  - {name: west, prometheus: {querier: hub, cluster: east}}\n",
            "clusters[1].prometheus.cluster: 'east' of querier 'hub' is clusters[0]'s",
        ),
        (
            MINIMAL + "kubernetes: {min_weight: 60}\n",
            "kubernetes.min_weight: Input should be less than or equal to 50",
        ),
        (
            MINIMAL + "leader_election: {retry_period: 1ms}\n",
            "leader_election.retry_period: Input should be greater than or equal to 0.1",
        ),
        ("clusters: " + "[" * 20_000 + "\n", "not a config: nested too deeply"),
        (  # found by an attack: an empty selector had an unlabelled model's weights written
            MINIMAL + "kubernetes: {label_selector: ''}\n",
            "kubernetes.label_selector: '' selects ExternalModels that never opted in",
        ),
        (  # and a negated one selects exactly those that never opted in
            MINIMAL + "kubernetes: {label_selector: '!weight-controller.opendatahub.io/managed'}\n",
            "kubernetes.label_selector: '!weight-controller.opendatahub.io/managed' selects",
        ),
        (
            MINIMAL + "kubernetes: {label_selector: 'team notin (a, b), tier!=x'}\n",
            "selects ExternalModels that never opted in",
        ),
        (  # found by an attack: a traceback from check-config
            MINIMAL + "scrape: {timeout: " + "9" * 5000 + "}\n",
            "not a config: Exceeds the limit (4300 digits) for integer string conversion",
        ),
        (  # found by an attack: accepted, then the cluster's read failed every tick
            "clusters: [{name: a, epp: {url: 'http://127.0.0.1:1/m'}, kv_tokens_per_pod: 1"
            + "0" * 400
            + "}]\n",
            "clusters[0].kv_tokens_per_pod: Input should be less than or equal to 1000000000000",
        ),
        (  # found by an attack: 66 KB ran check-config past 300 s at 1.8 GB
            "urls: &u ["
            + ", ".join(["x"] * 2000)
            + "]\nclusters: ["
            + ", ".join(f"{{name: c{i}, vllm_urls: *u}}" for i in range(500))
            + "]\n",
            "not a config: more than 200,000 values, anchors counted each time they are used",
        ),
        (  # found by an attack: /api/v1/query landed inside the query; every query failed
            "queriers: [{name: hub, url: 'http://127.0.0.1:9090/?tenant=a'}]\n"
            "clusters: [{name: a, prometheus: {querier: hub}}]\n",
            "queriers[0].url: 'http://127.0.0.1:9090/?tenant=a': a base URL, without ?query",
        ),
        (  # an empty query too (a review): /api/v1/query landed after the "?"
            "queriers: [{name: hub, url: 'http://127.0.0.1:9090/?'}]\n"
            "clusters: [{name: a, prometheus: {querier: hub}}]\n",
            "queriers[0].url: 'http://127.0.0.1:9090/?': a base URL, without ?query",
        ),
        (  # found by an attack: a __name__ matcher left the cluster healthy without a queue
            "clusters: [{name: a, prometheus: {url: 'http://127.0.0.1:9090',"
            " matchers: {__name__: vllm_kv_cache_usage_perc}}}]\n",
            "clusters[0].prometheus.matchers: '__name__': labels starting __ are Prometheus's",
        ),
        (  # 0 is off, as any duration is written; false is no duration
            MINIMAL + "weights: {settle: false}\n",
            "weights.settle: not a duration: False",
        ),
        (  # an hour ahead, any rising noise read as a full cache: 9 writes in 12 ticks
            MINIMAL + "weights: {forecast_horizon: 1h}\n",
            "weights.forecast_horizon: Input should be less than or equal to 600",
        ),
        (  # a route listed twice: the last entry's mapping silently won
            MINIMAL + "kubernetes:\n  httproutes:\n"
            "    - {namespace: apps, name: r, backends: {a: cluster-b}}\n"
            "    - {namespace: apps, name: r, backends: {a: cluster-c}}\n",
            "kubernetes.httproutes[1]: apps/r is httproutes[0] too",
        ),
        (  # a shared querier's query without its grouping: every cluster came back empty
            "queriers: [{name: hub, url: 'http://127.0.0.1:1/'}]\n"
            "clusters: [{name: a, prometheus: {querier: hub}}]\n"
            "prometheus_queries: {queue: 'sum(x{a=\"b\"$selector})'}\n",
            "prometheus_queries.queue: a shared querier (queriers[]) needs $by",
        ),
        (  # both listeners on one port: check-config passed, the second bind failed at start
            MINIMAL + "server: {bind: '0.0.0.0:8080', probe_bind: '127.0.0.1:8080'}\n",
            "server: probe_bind '127.0.0.1:8080' takes the port of bind '0.0.0.0:8080'",
        ),
        (  # a name may be the other's address (a review)
            MINIMAL + "server: {bind: '127.0.0.1:8080', probe_bind: 'localhost:8080'}\n",
            "server: probe_bind 'localhost:8080' takes the port of bind '127.0.0.1:8080'",
        ),
        (  # a querier's clusters read no model_name: every model's KV was read as one
            "clusters: [{name: a, model_name: m, prometheus: {url: 'http://127.0.0.1:1/'}}]\n",
            "clusters[0]: model_name: read from pages, not through prometheus",
        ),
        # the Lease holds it as an int32: the API server refused every write of the Lease
        (
            MINIMAL + "leader_election: {lease_duration: 10000000000}\n",
            "leader_election.lease_duration: Input should be less than or equal to 2147483647",
        ),
        # a bind no socket can take passed, then the daemon failed at start
        (MINIMAL + "server: {bind: 'a..b:8080'}\n", "server.bind: 'a..b' is not a host name"),
        (MINIMAL + "server: {probe_bind: 'x y:81'}\n", "server.probe_bind: 'x y' is not a host"),
        # an empty model_name read only the series without one
        (
            "clusters: [{name: a, vllm_urls: ['http://127.0.0.1:1/'], model_name: ''}]\n",
            "clusters[0].model_name: String should have at least 1 character",
        ),
        # a window of 0 was read as 1m without a word
        (MINIMAL + "prometheus_queries: {window: 0m}\n", "prometheus_queries.window: 0m: no rate"),
        # an attack: YAML's yes/on/true was taken for 1 by every number field
        (MINIMAL + "weights: {floor: yes}\n", "weights.floor: true: a boolean, not a number"),
        (MINIMAL + "health: {min_pod_fraction: on}\n", "health.min_pod_fraction: true: a"),
        (MINIMAL + "kubernetes: {min_weight: true}\n", "kubernetes.min_weight: true: a boolean"),
        (MINIMAL + "kubernetes: {write_retries: no}\n", "kubernetes.write_retries: false: a"),
        (
            "clusters: [{name: a, vllm_urls: ['http://127.0.0.1:1/'], kv_tokens_per_pod: yes}]\n",
            "clusters[0].kv_tokens_per_pod: true: a boolean, not a number",
        ),
    ],
)
def test_bad_config_names_field_and_reason(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(write(tmp_path, text))
    assert any(expected in line for line in raised.value.lines), raised.value.lines
    # pydantic's union branches are no field (a review: "min_weight.literal['auto']: ...")
    assert not any("literal[" in line or "constrained-" in line for line in raised.value.lines)


def test_twenty_thousand_problems_are_a_hundred_lines_and_a_count(tmp_path: Path) -> None:
    """Found by an attack: each line was checked against all before it, so 20,000 bad URLs
    took 11 s to list (40,000: past 30 s), and all were printed."""
    urls = ", ".join(f"'not-a-url-{i}'" for i in range(20_000))
    with pytest.raises(ConfigError) as raised:
        load_settings(write(tmp_path, f"clusters: [{{name: a, vllm_urls: [{urls}]}}]\n"))
    lines = raised.value.lines
    assert len(lines) == 101 and lines[-1] == "... and 19,900 more problems", lines[-3:]
    assert lines[0].startswith("clusters[0].vllm_urls[0]: ")


def test_probes_may_share_a_port_number_on_another_address(tmp_path: Path) -> None:
    server = "server: {bind: '127.0.0.1:8080', probe_bind: '127.0.0.2:8080'}\n"
    assert load_settings(write(tmp_path, MINIMAL + server)).server.probe_bind == "127.0.0.2:8080"


def test_a_problem_a_variable_gave_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by an attack: a bad WEIGHT_CONTROLLER_* value was named by its field alone, and
    the operator looked in a file that had it right."""
    monkeypatch.setenv("WEIGHT_CONTROLLER_WEIGHTS__FLOOR", "abc")
    monkeypatch.setenv("WEIGHT_CONTROLLER_CLUSTERS", '[{"name": "a", "vllm_urls": ["x"]}]')
    with pytest.raises(ConfigError) as raised:
        load_settings(write(tmp_path, MINIMAL + "scrape: {timeout: soon}\n"))
    lines = raised.value.lines
    assert any(
        line.startswith("weights.floor: ")
        and line.endswith("(from WEIGHT_CONTROLLER_WEIGHTS__FLOOR)")
        for line in lines
    ), lines
    assert any(
        line.startswith("clusters[0].vllm_urls[0]: ")
        and line.endswith("(from WEIGHT_CONTROLLER_CLUSTERS)")
        for line in lines
    ), lines
    assert any(line.startswith("scrape.timeout: ") and "(from" not in line for line in lines), lines


def test_a_misspelt_environment_name_is_refused_not_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEIGHT_CONTROLLER_INTERVALL", "20s")
    monkeypatch.setenv("WEIGHT_CONTROLLER_SCRAPE__TIMEOUT", "500ms")  # a real one is fine
    with pytest.raises(ConfigError) as raised:
        load_settings(write(tmp_path, MINIMAL))
    assert len(raised.value.lines) == 1
    assert raised.value.lines[0].startswith(
        "environment: WEIGHT_CONTROLLER_INTERVALL names no setting"
    )
    monkeypatch.delenv("WEIGHT_CONTROLLER_INTERVALL")
    monkeypatch.setenv("WEIGHT_CONTROLLER_SCRAPE__TIMOUT", "1s")  # inside a group: the model
    with pytest.raises(ConfigError) as raised:
        load_settings(write(tmp_path, MINIMAL))
    assert raised.value.lines == [
        "scrape.timout: Extra inputs are not permitted (from WEIGHT_CONTROLLER_SCRAPE__TIMOUT)"
    ]


def test_cli_exits_2_with_one_line_per_error_and_no_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "interval: nope\nweights: {floor: -1}\nclusters:\n  - name: a\n")
    done = subprocess.run(
        [sys.executable, "-m", "controller", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("config error: ") for line in lines)
    assert "Traceback" not in done.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "controller", "once", "--config", str(tmp_path / "absent.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEIGHT_CONTROLLER_")}
    bare = subprocess.run(
        [sys.executable, "-m", "controller", "once"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert bare.returncode == 2  # no file at all: the error says how to give one
    assert "no settings file given: --config FILE or $WEIGHT_CONTROLLER_CONFIG" in bare.stderr


def test_check_config_prints_normalised_settings(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "controller", "check-config", str(write(tmp_path, MINIMAL))],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    printed = yaml.safe_load(done.stdout)
    assert printed["interval"] == 10.0 and printed["scrape"]["timeout"] == 3.0
    assert printed["weights"]["floor"] == 2


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


LEADER = (
    "kubernetes.api_timeout: 8s with leader_election.retry_period 2s must stay under "
    "leader_election.renew_deadline 10s: a leader writes only with a whole API timeout of its "
    "lease left, so it would hold the Lease and never write (lower api_timeout, or raise "
    "renew_deadline and lease_duration)"
)
CHECKS = [
    # (config text, a line that must appear) — each exits 2 with one line per problem
    (
        "interval: .inf\nclusters: [{name: a, vllm_urls: ['http://127.0.0.1:1/']}]\n",
        "interval: Input should be a finite number",
    ),
    (
        "clusters: [{name: a, vllm_urls: ['http://127.0.0.1:1/'], ca_file: /nonexistent/ca.pem}]\n",
        "clusters[0].ca_file: cannot read /nonexistent/ca.pem: No such file or directory",
    ),
    (
        "clusters: [{name: a, vllm_urls: ['https://127.0.0.1:1/'], bearer_token_file: /nonexistent/t}]\n",
        "clusters[0].bearer_token_file: cannot read /nonexistent/t: No such file or directory",
    ),
    (
        "clusters: [{name: a, vllm_urls: ['http://127.0.0.1:1/']}]\n"
        "kubernetes: {httproutes: [{namespace: n, name: r, backends: {svc: ghost}}]}\n",
        "kubernetes.httproutes[0].backends.svc: no cluster named 'ghost'",
    ),
    (  # a stray $: string.Template would raise on every tick
        "clusters: [{name: a, prometheus: {url: 'http://127.0.0.1:1/'}}]\n"
        "prometheus_queries: {queue: 'sum(x$selector) $ 2'}\n",
        "prometheus_queries.queue: Invalid placeholder in string: line 1, col 17: a $ is a "
        "placeholder, a group's number ($1, ${1}) or $$ (a $)",
    ),
    (  # PromQL Prometheus refuses on every tick (HTTP 400): found by a review
        "clusters: [{name: a, prometheus: {url: 'http://127.0.0.1:1/'}}]\n"
        "prometheus_queries: {queue: 'sum by ($by) (x$selector'}\n",
        "prometheus_queries.queue: its ( at column 14 is never closed",
    ),
    (
        "clusters: [{name: a, prometheus: {url: 'http://127.0.0.1:1/'}}]\n"
        "prometheus_queries: {running: 'sum(x{a=\"b)\"}$selector}[5m]))'}\n",
        "prometheus_queries.running: its } at column 23 closes nothing",
    ),
    (  # the leader would hold the Lease and never write: a stranger's attack
        "clusters: [{name: a, vllm_urls: ['http://127.0.0.1:1/']}]\n"
        "kubernetes: {api_timeout: 8s}\nleader_election: {enabled: true}\n",
        LEADER,
    ),
    (  # $selector brings its own comma: {,cluster="a"} is refused by PromQL on every tick
        "clusters: [{name: a, prometheus: {url: 'http://127.0.0.1:1/'}}]\n"
        "prometheus_queries: {queue: 'sum(x{$selector})'}\n",
        "prometheus_queries.queue: renders '{,': $selector brings its own leading comma, so it "
        'follows a matcher (name{job="x"$selector}) or a name ({__name__="x"$selector})',
    ),
    (
        "clusters: [{name: a, prometheus: {url: 'http://127.0.0.1:1/'}}]\n"
        "prometheus_queries: {queue: 'sum(x{job=\"y\", $selector})'}\n",
        "prometheus_queries.queue: renders ', ,': $selector brings its own leading comma, so it "
        'follows a matcher (name{job="x"$selector}) or a name ({__name__="x"$selector})',
    ),
    (  # $quantile is the latency quantile's alone
        "clusters: [{name: a, prometheus: {url: 'http://127.0.0.1:1/'}}]\n"
        "prometheus_queries: {kv_max: 'quantile by ($by) ($quantile, x$selector)'}\n",
        "prometheus_queries.kv_max: unknown placeholder $quantile (known: $selector, $by, "
        "$and_by, $window, $lookback, $resolution; write a literal $ as $$)",
    ),
]


def test_run_with_leader_elect_refuses_a_timeout_no_lease_leaves_room_for(
    tmp_path: Path,
) -> None:
    """``--leader-elect`` turns election on where the file did not: checked then, as the
    file's setting is, before anything starts."""
    text = (
        "clusters: [{name: a, vllm_urls: ['http://127.0.0.1:1/']}]\n"
        "kubernetes: {api_timeout: 8s}\nserver: {bind: '127.0.0.1:0'}\n"
    )
    path = write(tmp_path, text)
    assert cli("check-config", str(path)).returncode == 0  # no election in the file: fine
    done = cli("run", "--config", str(path), "--leader-elect")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [f"config error: {LEADER} (--leader-elect)"]


@pytest.mark.parametrize(("text", "line"), CHECKS)
def test_check_config_finds_what_run_would_trip_on(tmp_path: Path, text: str, line: str) -> None:
    done = cli("check-config", str(write(tmp_path, text)))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"config error: {line}" in done.stderr.splitlines()


def test_every_problem_of_a_file_in_one_run(tmp_path: Path) -> None:
    text = (
        "interval: 5s\nscrape: {timeout: 9s}\nweights: {floor: -1}\n"
        "clusters: [{name: a, vllm_urls: ['http://127.0.0.1:1/']}, {name: a, epp_url: 'http://x/'}]\n"
    )
    lines = cli("check-config", str(write(tmp_path, text))).stderr.strip().splitlines()
    assert "config error: clusters: names must be unique: a" in lines
    assert "config error: scrape.timeout: must be shorter than interval" in lines
    assert any(line.startswith("config error: weights.floor") for line in lines)


def test_garbage_files_bad_environment_and_bad_arguments_are_one_line_each(tmp_path: Path) -> None:
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)))
    for done in (
        cli("check-config", str(binary)),
        cli(
            "check-config",
            str(write(tmp_path, MINIMAL)),
            env={"WEIGHT_CONTROLLER_CLUSTERS": "[{bad"},
        ),
        cli("simulate", "--set", "gain"),
        cli("no-such-command"),
        cli("run", "--no-such-flag"),
    ):
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["simulate", "--duration", "nan"], "argument --duration: 'nan': must be finite"),
        (["simulate", "--duration", "0"], "argument --duration: '0': must be finite and above 0"),
        (["simulate", "--workers", "-2"], "argument --workers: '-2': must be finite and above 0"),
        (["simulate", "--delay", "-10"], "argument --delay: '-10': must be finite, 0 or more"),
        (["simulate", "--seeds", "0"], "argument --seeds: '0': must be finite and above 0"),
        (["demo", "--duration", "-5"], "argument --duration: '-5': must be finite and above 0"),
        (["demo", "--interval", "inf"], "argument --interval: 'inf': must be finite"),
        (["status", "--watch", "x"], "argument --watch: 'x' is not a number"),
    ],
)
def test_a_number_no_command_can_run_with_is_refused_as_an_argument(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an attack: ``simulate --duration nan`` (0, -5) and ``--workers -2`` ended in
    a traceback, ``--delay -10`` and ``--seeds 0`` ran to a table, ``demo --duration nan``
    exited 0 after one tick."""
    with pytest.raises(SystemExit) as ended:
        _parser().parse_args(argv)
    assert ended.value.code == 2 and said in capsys.readouterr().err


def test_a_config_of_just_a_short_interval_works(tmp_path: Path) -> None:
    done = cli(
        "check-config",
        str(
            write(
                tmp_path,
                "interval: 1s\nclusters: [{name: a, vllm_urls: ['http://127.0.0.1:1/']}]\n",
            )
        ),
    )
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["scrape"]["timeout"] == 0.5  # derived from the interval


def test_run_refuses_a_missing_file_before_starting(tmp_path: Path) -> None:
    text = "clusters: [{name: a, vllm_urls: ['http://127.0.0.1:1/'], ca_file: /nonexistent/ca.pem}]\nserver: {bind: '127.0.0.1:0'}\n"
    done = cli("run", "--config", str(write(tmp_path, text)))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "config error: clusters[0].ca_file: cannot read /nonexistent/ca.pem: No such file or directory"
    ]


def test_a_moved_field_is_read_at_its_new_place_and_said_to_have_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = MINIMAL + "scrape: {min_pod_fraction: 0.25}\n"
    done = cli("check-config", str(write(tmp_path, old)))
    assert done.returncode == 0, done.stderr
    normalised = yaml.safe_load(done.stdout)
    assert normalised["health"]["min_pod_fraction"] == 0.25
    assert "min_pod_fraction" not in normalised["scrape"]
    assert done.stderr.strip().splitlines() == [
        "config note: scrape.min_pod_fraction has moved to health.min_pod_fraction: it is read "
        "there; write it there"
    ]
    # the environment's old spelling moves too, and is said to have moved
    env = {"WEIGHT_CONTROLLER_SCRAPE__MIN_POD_FRACTION": "0.75"}
    done = cli("check-config", str(write(tmp_path, MINIMAL)), env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines() == [
        "config note: WEIGHT_CONTROLLER_SCRAPE__MIN_POD_FRACTION has moved to "
        "WEIGHT_CONTROLLER_HEALTH__MIN_POD_FRACTION: it is read there; set that instead"
    ]
    assert yaml.safe_load(done.stdout)["health"]["min_pod_fraction"] == 0.75
    # settings read back (replay rebuilds them) with the old variable still set: one value
    monkeypatch.setenv("WEIGHT_CONTROLLER_SCRAPE__MIN_POD_FRACTION", "0.75")
    settings = load_settings(write(tmp_path, MINIMAL))
    assert settings.health.min_pod_fraction == 0.75
    again = Settings(**settings.model_dump(mode="json", exclude_unset=True))
    assert again.health.min_pod_fraction == settings.health.min_pod_fraction


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (
            "scrape: {min_pod_fraction: 0.25}\nhealth: {min_pod_fraction: 0.5}\n",
            "scrape.min_pod_fraction (0.25) is set beside health.min_pod_fraction (0.5)",
        ),
        ("scrape: {min_pod_fraction: 2}\n", "scrape.min_pod_fraction: Input should be less"),
        ("scrape: {min_pod_fraction: x}\n", "scrape.min_pod_fraction: Input should be a valid"),
        ("scrape: {min_pod_fraction: 0.3}\nhealth: null\n", "health: Input should be a valid"),
    ],
)
def test_a_moved_field_set_twice_or_badly_is_refused_by_its_old_name(
    tmp_path: Path, text: str, line: str
) -> None:
    done = cli("check-config", str(write(tmp_path, MINIMAL + text)))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"config error: {line}"), done.stderr


def test_promql_s_own_group_numbers_are_written_as_promql_writes_them() -> None:
    """``label_replace``'s ``"$1"`` and ``"${1}"`` go to Prometheus as written (#41: they were
    refused, and ``$$1`` asked for); ``$$`` is still one ``$``."""
    template = 'sum by ($by) (label_replace(x$selector, "p", "$1-${2}-$$3", "i", "(.*)-(.*)"))'
    settings = build_settings(
        {
            "clusters": [{"name": "a", "prometheus": {"url": "http://127.0.0.1:1/"}}],
            "prometheus_queries": {"queue": template},
        }
    )
    built = queries_for(settings.prometheus_queries, {"ns": "llm"}, "cluster")
    assert built["queue"] == (
        'sum by (cluster) (label_replace(x,ns="llm", "p", "$1-${2}-$3", "i", "(.*)-(.*)"))'
    )


def test_a_host_no_resolver_can_ask_for_is_refused_at_start_up() -> None:
    """Found by an attack: http://a..b/metrics (and a label of 70 characters) passed
    check-config, then every fetch of the cluster failed as internal (UnicodeError from the
    IDNA codec). IPv6 literals and punycode names are hosts."""
    for host in ("a..b", "a" * 70 + ".x"):
        with pytest.raises(ConfigError, match=r"clusters\[0\].vllm_urls\[0\]: .* is not a host"):
            build_settings({"clusters": [{"name": "c", "vllm_urls": [f"http://{host}/metrics"]}]})
    for fine in ("http://[::1]:8000/metrics", "http://xn--bcher-kva.example/metrics"):
        build_settings({"clusters": [{"name": "c", "vllm_urls": [fine]}]})


@pytest.mark.parametrize("content", [b"", b"  \n", "tökén".encode(), b"two words"])
def test_a_token_file_no_header_can_carry_is_refused_at_start_up(
    tmp_path: Path, content: bytes
) -> None:
    """Found by an attack: an empty or non-ASCII token file passed check-config, then every
    fetch of the cluster failed as auth."""
    token = tmp_path / "token"
    token.write_bytes(content)
    text = f"clusters: [{{name: a, vllm_urls: ['https://127.0.0.1:1/'], bearer_token_file: {token}}}]\n"
    done = cli("check-config", str(write(tmp_path, text)))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"clusters[0].bearer_token_file: {token}: the token is empty or holds" in done.stderr


def test_a_fifo_or_a_huge_file_where_a_token_goes_is_refused_without_blocking(
    tmp_path: Path,
) -> None:
    """Found by an attack: check-config read a FIFO token file and waited for ever for a
    writer (``run`` would too); a 20 MB token passed and went into every request."""
    fifo, huge = tmp_path / "fifo", tmp_path / "huge"
    os.mkfifo(fifo)
    huge.write_text("x" * 70_000)
    for path, why in ((fifo, "not a regular file"), (huge, "larger than 65536 bytes")):
        url = "https://127.0.0.1:1/"
        text = f"clusters: [{{name: a, vllm_urls: ['{url}'], bearer_token_file: {path}}}]\n"
        done = cli("check-config", str(write(tmp_path, text)))  # cli's own timeout bounds it
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert f"clusters[0].bearer_token_file: cannot read {path}: {why}" in done.stderr


def test_a_config_path_that_is_no_file_is_refused_without_blocking(tmp_path: Path) -> None:
    """Found by an attack: check-config of a FIFO waited for ever for a writer, and of
    /dev/zero read until memory ran out."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        done = cli("check-config", str(path))  # cli's own timeout bounds it
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert f"{path}: cannot read: not a regular file" in done.stderr


def test_an_interval_past_a_minute_keeps_staleness_past_it_unless_set(tmp_path: Path) -> None:
    """Unset, health.max_staleness follows a long interval: 60 s of a 2 m interval would
    judge a reading held through one failed fetch stale, and is refused when set."""
    settings = load_settings(write(tmp_path, "interval: 2m\n" + MINIMAL.split("\n", 1)[1]))
    assert settings.health.max_staleness == 360.0
    assert load_settings(write(tmp_path, MINIMAL)).health.max_staleness == 60.0


def test_the_checks_beside_a_field_error_take_staleness_s_default_as_it_is_derived(
    tmp_path: Path,
) -> None:
    """A review: beside a typo, the checks on raw data took staleness as 60 s whatever the
    interval, and refused a 2 m interval's file the typo's fix made valid."""
    text = "interval: 2m\nweights: {bogus: 1}\n" + MINIMAL.split("\n", 1)[1]
    with pytest.raises(ConfigError) as raised:
        load_settings(write(tmp_path, text))
    assert raised.value.lines == ["weights.bogus: Extra inputs are not permitted"]


def test_replay_s_step_keeps_a_staleness_longer_than_it() -> None:
    """``--step``: staleness follows the step only where it would be no longer than it."""
    from controller.replay import replay_settings

    clusters = [{"name": "a", "vllm_urls": ["http://127.0.0.1:1/"]}]
    own = build_settings({"clusters": clusters, "health": {"max_staleness": "10m"}})
    assert replay_settings(own, {}, step=300).health.max_staleness == 600
    default = build_settings({"clusters": clusters})
    assert replay_settings(default, {}, step=300).health.max_staleness == 900


def test_a_host_or_nameserver_no_resolver_can_ask_for_is_refused_at_start_up(
    tmp_path: Path,
) -> None:
    """Found by an attack: ``pods.dns: a..b.svc`` (or a label over 63 characters) and a
    nameserver port of 99999 passed check-config, then raised on every tick (``internal``)."""
    cases = [
        ("{dns: 'a..b.svc'}", "pods.dns: 'a..b.svc' is not a host name"),
        (f"{{dns: '{'a' * 64}.svc'}}", "is not a host name"),
        ("{dns: x.svc, nameserver: '127.0.0.1:99999'}", "is not ip:port with a port of"),
        # a review: a ':' skipped the check, and a name for the server drops every answer
        ("{dns: 'vllm..llm.svc:8000'}", "is not a host name"),
        ("{dns: 'localhost:8000'}", "only letters, digits, '-', '_', dots"),
        ("{dns: x.svc, nameserver: 'localhost:53'}", "'localhost' is not an IP address"),
        # a review: brackets, and names past 253 characters, found nothing, unsaid
        ("{dns: '[127.0.0.1]'}", "only letters, digits, '-', '_', dots"),
        ("{dns: '::1]'}", "only letters, digits, '-', '_', dots"),
        (f"{{dns: '{'a.' * 150}svc'}}", "a bracket, or over 253 characters"),
    ]
    for pods, line in cases:
        done = cli("check-config", str(write(tmp_path, f"clusters: [{{name: a, pods: {pods}}}]\n")))
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert line in done.stderr, done.stderr
    for fine in ("{dns: x.svc, nameserver: '[::1]:53'}", "{dns: 'bücher.llm.svc.'}"):
        text = f"clusters: [{{name: a, pods: {fine}}}]\n"
        assert cli("check-config", str(write(tmp_path, text))).returncode == 0


def test_a_ca_bundle_with_comments_in_any_encoding_is_read_as_the_run_reads_it(
    tmp_path: Path,
) -> None:
    """A review: the start-up check handed the bundle to ``cadata`` as a str, which must be
    ASCII, so a system bundle's ``# NetLock Arany (Class Gold) Főtanúsítvány`` comment was a
    traceback; the run, which loads the file by its path, reads it."""
    cert, _ = self_signed(tmp_path)
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes("# NetLock Arany (Class Gold) Főtanúsítvány\n".encode() + cert.read_bytes())
    url = "https://127.0.0.1:1/"
    text = f"clusters: [{{name: a, vllm_urls: ['{url}'], ca_file: {bundle}}}]\n"
    done = cli("check-config", str(write(tmp_path, text)))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


def test_windows_and_push_intervals_promql_cannot_hold_are_refused(tmp_path: Path) -> None:
    """A review: ``push_interval: 3000000h`` and ``window: 3000000h`` passed, then PromQL
    refused the duration ("out of range") on every query."""
    head = "clusters: [{name: a, prometheus: {querier: q}}]\n"
    cases = [
        (
            "queriers: [{name: q, url: 'http://127.0.0.1:1/', push_interval: 43h}]\n",
            "queriers[0].push_interval: Input should be less than or equal to 151200",
        ),
        (
            "queriers: [{name: q, url: 'http://127.0.0.1:1/'}]\n"
            "prometheus_queries: {window: 169h}\n",
            "prometheus_queries.window: longer than 7 days",
        ),
    ]
    for rest, line in cases:
        done = cli("check-config", str(write(tmp_path, head + rest)))
        assert done.returncode == 2 and line in done.stderr, done.stderr


def test_a_querier_s_token_and_ca_files_are_checked_at_start_up(tmp_path: Path) -> None:
    """Found by a review: a shared querier's empty token file and missing CA bundle passed
    check-config, then every query of every cluster behind it failed (auth; a traceback)."""
    token = tmp_path / "token"
    token.write_bytes(b"")
    text = (
        "queriers: [{name: hub, url: 'https://127.0.0.1:1/', "
        f"bearer_token_file: {token}, ca_file: /nonexistent/ca.pem}}]\n"
        "clusters: [{name: a, prometheus: {querier: hub, cluster: a}}]\n"
    )
    done = cli("check-config", str(write(tmp_path, text)))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"queriers[0].bearer_token_file: {token}: the token is empty" in done.stderr
    assert "queriers[0].ca_file: cannot read /nonexistent/ca.pem" in done.stderr


def test_a_kubeconfig_no_client_can_load_is_refused_at_start_up(tmp_path: Path) -> None:
    """Found by an attack: /etc/hostname, an empty file, bad YAML or a missing context as
    kubernetes.kubeconfig passed check-config, then ``once``/``run`` raised a TypeError or
    a YAML traceback."""
    from tests.support.kube import kubeconfig

    good = kubeconfig(tmp_path / "good", "http://127.0.0.1:1")
    (tmp_path / "empty").write_text("")
    (tmp_path / "bad").write_text("clusters: [\n")
    cases = [
        (tmp_path / "empty", "", "not a kubeconfig (a YAML mapping"),
        (tmp_path / "bad", "", "not YAML: ParserError"),
        (good, "context: nope, ", "has no context 'nope' (its contexts: double)"),
        (good, "", None),
    ]
    for path, context, why in cases:
        text = (
            "clusters: [{name: a, vllm_urls: ['http://127.0.0.1:1/']}]\n"
            f"kubernetes: {{enabled: true, {context}kubeconfig: {path}}}\n"
        )
        done = cli("check-config", str(write(tmp_path, text)))
        if why is None:
            assert done.returncode == 0, done.stderr
            continue
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert f"config error: kubernetes.kubeconfig: {path}: {why}" in done.stderr
