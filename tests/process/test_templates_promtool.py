"""The default PromQL templates held to promtool's rule tests: what they read when a target
serves a name under both spellings, and whose time a sample's age is."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from controller.settings.queries import PrometheusQueries, render
from controller.sources.prometheus import Windows, queries_for
from tests.support.prometheus import binary


def test_the_templates_on_promtool_both_spellings_and_each_sample_s_own_time(
    tmp_path: Path,
) -> None:
    """Review of #41: timestamp() of anything but a plain selector is the evaluation time (a
    dead pod never looked stale), and a target serving both spellings within the lookback
    (prometheus-client upgraded in place) counted twice in sums and failed the pool product
    ("many-to-many matching"). Checked by promtool's rule tests on the default templates."""
    q = PrometheusQueries()

    def expr(template: str) -> str:
        return render(template, "", "cluster", "60s", "60s")

    pod, other = 'cluster="a",instance="p1",job="j"', 'cluster="b",instance="p2",job="j"'
    trt = f'nv_trt_llm_kv_cache_block_metrics{{{other},model="m",version="1",kv_cache_block_type='
    switch = "{} {} {} _ _ _", "_ _ _ {} {} {}"  # one spelling, then the other
    series = [
        (f"sglang:page_size{{{pod}}}", switch[0].format(16, 16, 16)),
        (f"sglang_page_size{{{pod}}}", switch[1].format(16, 16, 16)),
        (f"sglang:num_pages{{{pod}}}", switch[0].format(100, 100, 100)),
        (f"sglang_num_pages{{{pod}}}", switch[1].format(100, 100, 100)),
        (f"sglang:num_running_reqs{{{pod}}}", switch[0].format(3, 3, 3)),
        (f"sglang_num_running_reqs{{{pod}}}", switch[1].format(3, 3, 3)),
        (f"sglang:token_usage{{{pod}}}", switch[0].format(0.5, 0.5, 0.5)),
        (f"sglang_token_usage{{{pod}}}", switch[1].format(0.6, 0.6, 0.6)),
        (trt + '"tokens_per"}', "32 32 32 32 32 32"),
        (trt + '"max"}', "1000 1000 1000 1000 1000 1000"),
    ]
    stale = f"vllm:kv_cache_usage_perc{{{other}}}"
    tests = [
        {
            "interval": "15s",
            "input_series": [{"series": s, "values": v} for s, v in series],
            "promql_expr_test": [
                {
                    "expr": expr(q.kv_tokens),
                    "eval_time": "75s",
                    "exp_samples": [
                        {"labels": f"{{{pod}}}", "value": 1600},
                        {"labels": f"{{{other}}}", "value": 32000},
                    ],
                },
                {
                    "expr": expr(q.running),
                    "eval_time": "75s",
                    "exp_samples": [{"labels": '{cluster="a"}', "value": 3}],
                },
                {  # one spelling's series, never both averaged (0.55): for one lookback
                    # after the switch the first spelling's last sample stands
                    "expr": expr(q.kv_mean),
                    "eval_time": "75s",
                    "exp_samples": [{"labels": '{cluster="a"}', "value": 0.5}],
                },
            ],
        },
        {
            "interval": "30s",
            "input_series": [{"series": stale, "values": "0.5 0.5 0.5"}],
            "promql_expr_test": [
                {
                    "expr": render(q.kv_oldest, "", "cluster", "60s", "240s"),
                    "eval_time": "4m",
                    "exp_samples": [{"labels": '{cluster="b"}', "value": 60}],
                }
            ],
        },
    ]
    (tmp_path / "rules.yml").write_text("groups: []\n")
    spec = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec, width=100_000))
    done = promtool(tmp_path, "test", "rules", "test.yml")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("push_interval", [1.25, 0.5, 7.3, 300000.0])
def test_every_query_a_push_interval_gives_is_promql_prometheus_parses(
    tmp_path: Path, push_interval: float
) -> None:
    """A stranger's attack: ``push_interval: 1.25s`` rendered ``$lookback`` as ``2.5s`` and
    ``300000`` the rate window as ``1.2e+06s``, neither a PromQL duration (whole units
    only): Prometheus answered every query 400, every tick, and check-config had passed.
    Every query a querier sends, held to promtool's own parser (``check rules``)."""
    queries = PrometheusQueries()
    windows = Windows.of(queries, push_interval)
    built = queries_for(queries, {"cluster": "a"}, "cluster", windows, ',cluster=~"a|b"')
    rules = [{"record": f"check:{name}", "expr": text} for name, text in sorted(built.items())]
    (tmp_path / "rules.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "queries", "rules": rules}]}, width=100_000)
    )
    done = promtool(tmp_path, "check", "rules", "rules.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout


def promtool(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Debian's promtool, run in ``where``, bounded."""
    return subprocess.run(
        [binary("promtool"), *args],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
