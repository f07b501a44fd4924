"""The PromQL templates for clusters read through a Prometheus or Thanos Querier, built from
the engine table (``controller.engines``) and the EPP's families (``controller.families``) so
that a name is spelled in one place. A querier's clusters may run different engines: each
signal is the union (``or``) of every engine's series, so the batched queries do not grow
with the clusters, and a pod is read by whichever engine's names it carries.

Placeholders: ``$selector`` becomes the matchers, each with a leading comma
(``,cluster=~"a|b"``) or nothing; ``$by`` the label the answer is grouped by (the querier's
cluster label, or nothing for a querier of one cluster's own) and ``$and_by`` the same after a
comma; ``$window`` the rate window and ``$lookback`` how far back a gauge's last sample is taken
(both follow the querier's push interval), ``$resolution`` a subquery's step over the lookback
(a quarter of the push interval); ``$quantile`` the quantile. A ``$`` that PromQL
itself needs is written as PromQL writes it: ``label_replace``'s ``"$1"`` and ``"${1}"`` (a
group by number is never a placeholder; ``$$`` is one ``$`` as well, and a group by name is
written ``$$name``). An ``ns:`` name is read under
both spellings, ``ns:x or ns_x`` (prometheus-client >= 0.23 serves ``ns_…`` to a Prometheus
that negotiates OpenMetrics), each an exact selector of its own (``selectors``). Where a
signal has several names, ``or`` keeps the first name's series and adds the later names'
only where the first has none (``or`` matches label sets without the name); an engine's
label matchers (TensorRT-LLM's ``kv_cache_block_type="fraction"``) are part of its selector.
``timestamp()`` is taken of each plain selector (of anything else it is the time of
evaluation).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from string import Template

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from controller.engines import ENGINES, VLLM, Engine, Family, Pool, spellings
from controller.families import EPP_LATENCY
from controller.settings.durations import seconds

# A rate window, or a querier's push interval, longer than a week reads nothing a default
# Prometheus (15 days of retention) still holds in most of its ticks; past ~292 years PromQL
# refuses the duration outright ("duration out of range"), a 400 on every query.
MAX_WINDOW = 7 * 86400

# ``string.Template``'s pattern, but a ``$`` before a digit, or before ``{digits}``, matches
# none of its groups and stays as text (``invalid`` is what raises).
_PLACEHOLDERS = r"""
\$(?:
  (?P<escaped>\$) |
  (?P<named>[_a-z][_a-z0-9]*) |
  {(?P<braced>[_a-z][_a-z0-9]*)} |
  (?P<invalid>(?![0-9]|\{[0-9]+\}))
)
"""


class _Template(Template):
    """``string.Template`` whose ``$`` before a digit, or a ``{digits}``, is text: PromQL's
    ``label_replace`` writes a capture group so (Go's ``regexp.Expand``: ``$1``, ``${1}``)."""

    pattern = _PLACEHOLDERS  # type: ignore[assignment]  # Template compiles it on subclassing


def render(
    template: str,
    selected: str,
    by: str,
    window: str,
    lookback: str,
    resolution: str = "1s",
    **extra: str,
) -> str:
    and_by = f", {by}" if by else ""
    return _Template(template).substitute(
        selector=selected,
        by=by,
        and_by=and_by,
        window=window,
        lookback=lookback,
        resolution=resolution,
        **extra,
    )


def renders(template: str, quantile: bool = False) -> str | None:
    """Why ``template`` cannot be rendered (an unknown ``$name``, a ``$`` before neither a
    name nor a group's number), or ``None``: checked at start-up, so no tick ever raises on
    it. Only the latency quantile's template is given ``$quantile``."""
    extra = {"quantile": "0.5"} if quantile else {}
    try:
        rendered = render(template, ',cluster="a"', "cluster", "1m", "30s", **extra)
    except KeyError as exc:
        known = "$selector, $by, $and_by, $window, $lookback, $resolution" + (
            ", $quantile" if quantile else ""
        )
        return f"unknown placeholder ${exc.args[0]} (known: {known}; write a literal $ as $$)"
    except ValueError as exc:  # string.Template: "Invalid placeholder in string: line 1, col 5"
        return f"{exc}: a $ is a placeholder, a group's number ($1, ${{1}}) or $$ (a $)"
    if quantile and render(template, "", "", "1m", "30s", quantile="0.5") == render(
        template, "", "", "1m", "30s", quantile="0.9"
    ):
        return "does not use $quantile: p50 and p90 would be the same number"
    # $selector brings its own leading comma: after '{' or another ',' PromQL refuses the
    # query on every tick (its grammar takes a trailing comma in a matcher list, never a
    # leading or a doubled one)
    if (comma := _STRAY_COMMA.search(rendered)) is not None:
        return (
            f"renders {comma.group(0)!r}: $selector brings its own leading comma, so it "
            'follows a matcher (name{job="x"$selector}) or a name ({__name__="x"$selector})'
        )
    return unbalanced(template)


_STRAY_COMMA = re.compile(r"[{,]\s*,")


_CLOSES = {")": "(", "]": "[", "}": "{"}


def unbalanced(query: str) -> str | None:
    """Why ``query`` cannot be PromQL by its shape alone, or ``None``: empty, a bracket
    never closed or closing none, a string never closed. Not a parser: what Prometheus
    refuses on every tick (``sum(``: HTTP 400) and no config should carry past start-up.
    Strings are PromQL's (``"…"`` and ``'…'`` with escapes, raw in backticks), and ``#`` begins
    a comment to the end of the line."""
    if not query.strip():
        return "is empty"
    opened: list[tuple[str, int]] = []
    at = 0
    while at < len(query):
        char = query[at]
        if char in "\"'`":
            end = at + 1
            while end < len(query) and query[end] != char:
                end += 2 if query[end] == "\\" and char != "`" else 1
            if end >= len(query):
                return f"a string opened at column {at + 1} is never closed"
            at = end + 1
            continue
        if char == "#":
            newline = query.find("\n", at)
            at = len(query) if newline < 0 else newline
            continue
        if char in "([{":
            opened.append((char, at))
        elif char in _CLOSES:
            if not opened or opened[-1][0] != _CLOSES[char]:
                return f"its {char} at column {at + 1} closes nothing"
            opened.pop()
        at += 1
    if opened:
        char, at = opened[-1]
        return f"its {char} at column {at + 1} is never closed"
    return None


def quoted(value: str) -> str:
    """``value`` as a PromQL string: double-quoted, with Go's escapes for what it holds (a
    label value is literal text: a backslash in it is a backslash)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selectors(name: str, suffix: str = "", family: Family | None = None) -> list[str]:
    """A selector of each spelling of ``name`` (with ``suffix``: ``_bucket``, ``_count``),
    with the matchers of ``family`` and ``$selector``. One exact name each, never a regex
    over both: a target that serves both spellings within the lookback (prometheus-client
    upgraded in place) would otherwise count twice in a sum, or fail a function
    (``timestamp``, ``rate``: "vector cannot contain metrics with the same labelset") or a
    product ("many-to-many matching")."""
    # an engine row's values go into a template: a ``$`` of theirs is text, never a
    # placeholder (``$$``), and each is escaped as a PromQL string
    matchers = (
        "".join(f",{k}={quoted(v).replace('$', '$$')}" for k, v in family.match) if family else ""
    )
    return [f'{{__name__="{spelled}{suffix}"{matchers}$selector}}' for spelled in spellings(name)]


def either(name: str, shape: str, suffix: str = "", family: Family | None = None) -> str:
    """``shape`` (``{}`` for a selector) for each spelling of ``name``, joined by ``or``: the
    first spelling's series, the other's only where the first has none (``or`` matches label
    sets without the name)."""
    return " or ".join(shape.format(s) for s in selectors(name, suffix, family))


def _each(engines: Sequence[Engine], family_of: str, shape: str) -> str:
    """``shape`` for every name of one signal of every engine (``family_of``: ``kv``,
    ``waiting``, ``running``), each spelling of each, joined by ``or``."""
    families: list[Family] = [getattr(engine, family_of) for engine in engines]
    return " or ".join(either(name, shape, family=f) for f in families for name in f.names)


_LAST = "last_over_time({}[$lookback])"


def _pool(pool: Pool) -> str | None:
    """One pool rule of an engine as PromQL, tokens per engine process: two gauges multiplied
    series by series (the labels that tell them apart ignored), or a gauge in tokens. An
    info-style rule's sizes are labels, which PromQL cannot multiply: ``kv_pools`` reads
    vLLM's; another engine's info rule is not read through a querier."""
    if pool.block is not None and pool.count is not None:
        ignored = sorted({k for k, _ in (*pool.block.match, *pool.count.match)})
        matching = f" ignoring({', '.join(ignored)})" if ignored else ""
        block = either(pool.block.names[0], _LAST, family=pool.block)
        count = either(pool.count.names[0], _LAST, family=pool.count)
        return f"({block}) *{matching} ({count})"
    if pool.tokens is not None:
        return either(pool.tokens.names[0], _LAST, family=pool.tokens)
    return None


_VLLM_INFO = next(p for p in VLLM.pools if p.info)
# How long a replica's pool is read back through a querier after Ray stopped exporting it
# (a gauge not set again is dropped; vLLM sets its pool's once, at start), while the
# replica's KV series is there. A replica that lives longer counts as a replica.
POOL_KEPT = "2w"


def _units(engines: Sequence[Engine]) -> str:
    """The labels that tell apart the serving processes of one page beside ``job`` and
    ``instance`` (Ray Serve's ``ReplicaId``), each after a comma."""
    return "".join(
        f", {label}" for label in sorted({e.replica_label or "" for e in engines} - {""})
    )


def _infos(engines: Sequence[Engine]) -> str:
    """Every info rule with vLLM's pool labels (vLLM's own, and vLLM's inside Ray Serve), as
    its last sample; a replica's kept while the replica's KV series is there."""
    shapes = []
    for engine in engines:
        for pool in engine.pools:
            if pool.info is None or (pool.block_label, pool.count_label) != (
                _VLLM_INFO.block_label,
                _VLLM_INFO.count_label,
            ):
                continue
            if engine.replica_label is None:
                shapes.append(either(pool.info, _LAST))
                continue
            # The info gauge names no model (vLLM's labels are the cache config's and the
            # engine's): the replicas are the model's by their KV series (``$selector``), the
            # info theirs by the join, never by matchers it cannot carry.
            process = f", {engine.process_label}" if engine.process_label else ""
            alive = _each([engine], "kv", _LAST)
            kept = " or ".join(
                f'last_over_time({{__name__="{name}"}}[{POOL_KEPT}])'
                for name in spellings(pool.info)
            )
            on = f"job, instance, {engine.replica_label}{process}$and_by"
            shapes.append(f"(({kept}) and on ({on}) ({alive}))")
    return " or ".join(shapes)


def default_templates(engines: Sequence[Engine]) -> dict[str, str]:
    """The default PromQL of every template, for the clusters of ``engines`` (the built-in
    rows, and the config's own: ``Settings.engines``)."""
    kv_last = _each(engines, "kv", _LAST)
    # A fraction 0..1 or nothing: one pod's NaN, -0.9 or 2.5 (a broken exporter, a
    # percentage) left out of the mean as a page read directly leaves it out, never averaged
    # in (a 95%-full cluster read 0.33 through a querier, found by an attack); NaN fails
    # every comparison. ``kv_valid_pods`` counts the pods with one, as ``pods`` counts those
    # reporting any (a pod with one valid sample answers, as a page does): the others are
    # named. Not ``kv_last unless kv_valid``: the series twice, a URL past 8 KB at 40
    # clusters, which proxies refuse.
    kv_valid = f"(({kv_last}) >= 0 <= 1)"
    # each sample's own time: timestamp() of a plain selector (of anything else it is the
    # time of evaluation, and a dead pod would never look stale)
    kv_times = _each(engines, "kv", "timestamp({})")
    # the EPP's histogram, newest name first, then each engine's e2e one
    latency = (*EPP_LATENCY, *(e.latency for e in engines if e.latency))
    # each engine's pool rules in its order (``or``: the first a series has): tokens by pod
    pools = " or ".join(
        f"({rule})" for e in engines for rule in map(_pool, e.pools) if rule is not None
    )
    units = _units(engines)
    sizes = f"{_VLLM_INFO.count_label}, {_VLLM_INFO.block_label}"
    return {
        "kv_mean": f"avg by ($by) {kv_valid}",
        "kv_max": f"max by ($by) {kv_valid}",
        "kv_valid_pods": f"count by ($by) (count by (job, instance{units}$and_by) {kv_valid})",
        # the subquery reaches past the querier's lookback delta (5m: a push interval may be
        # longer) at its own resolution: left out, it is the server's evaluation interval
        # (1m by default), whose steps are absolute multiples of it, so within a lookback of
        # 20s there was often no step (no answer: staleness unchecked) and else one up to 20s
        # old (checked on Prometheus 2.42 at evaluation_interval 1m)
        "kv_oldest": f"min by ($by) (max_over_time(({kv_times})[$lookback:$resolution]))",
        "pods": f"count by ($by) (count by (job, instance{units}$and_by) ({kv_last}))",
        # engine processes by pod (or replica) and pool; a replica restarted under a new
        # worker while the old one's series linger is still one (``group``)
        "kv_pools": f"count by (job, instance{units}, {sizes}$and_by) "
        f"(group by (job, instance{units}, {_VLLM_INFO.engine_label}, {sizes}$and_by) "
        f"({_infos(engines)}))",
        "kv_tokens": f"sum by (job, instance{units}$and_by) ({pools})",
        "queue": f"sum by ($by) ({_each(engines, 'waiting', _LAST)})",
        "running": f"sum by ($by) ({_each(engines, 'running', _LAST)})",
        "latency_quantile": " or ".join(
            "histogram_quantile($quantile, sum by (le$and_by) "
            f"({either(f, 'rate({}[$window])', '_bucket')}))"
            for f in latency
        ),
        "latency_requests": " or ".join(
            f"sum by ($by) ({either(f, 'increase({}[$window])', '_count')})" for f in latency
        ),
    }


_DEFAULTS = default_templates(list(ENGINES.values()))


class PrometheusQueries(BaseModel):
    """PromQL templates for clusters read through Prometheus (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: str = Field(
        default="1m",
        pattern=r"^[0-9]+(ms|s|m|h)$",
        description="Rate window for latency and requests, at least 4 of Prometheus' scrape "
        "intervals; a querier whose push interval is longer uses 4 of those instead.",
    )
    kv_mean: str = Field(
        default=_DEFAULTS["kv_mean"],
        description="Mean KV-cache use over pods and engines, of the fractions 0..1; the new "
        "name wins per series.",
    )
    kv_max: str = Field(
        default=_DEFAULTS["kv_max"], description="Highest KV-cache use of any engine."
    )
    kv_valid_pods: str = Field(
        default=_DEFAULTS["kv_valid_pods"],
        description="Pods whose KV-cache use is a fraction 0..1: the rest of pods (NaN, "
        "negative, a percentage) are left out of kv_mean and kv_max, and named out_of_range.",
    )
    kv_oldest: str = Field(
        default=_DEFAULTS["kv_oldest"],
        description="Time of the oldest pod's newest KV sample: older than "
        "health.max_staleness is stale (Prometheus keeps returning a dead pod's last sample "
        "for 5 minutes).",
    )
    pods: str = Field(
        default=_DEFAULTS["pods"],
        description="Pods reporting KV-cache use.",
    )
    kv_pools: str = Field(
        default=_DEFAULTS["kv_pools"],
        description="Engines by pod and KV pool (vllm:cache_config_info's num_gpu_blocks "
        "and block_size labels; PromQL cannot read a label as a number, so the controller "
        "sums engines × blocks × block size). Fewer pods here than pods reporting KV: "
        "capacity in pods.",
    )
    kv_tokens: str = Field(
        default=_DEFAULTS["kv_tokens"],
        description="KV-cache tokens by pod, for the engines that publish their pool as "
        "numbers (SGLang's page_size × num_pages or max_total_num_tokens, TensorRT-LLM's "
        "tokens per block × max blocks); added to kv_pools' pods. Fewer pods in both than "
        "pods reporting KV: capacity in pods.",
    )
    queue: str = Field(
        default=_DEFAULTS["queue"],
        description="Requests waiting, summed over pods.",
    )
    running: str = Field(
        default=_DEFAULTS["running"],
        description="Requests running, summed over pods.",
    )
    latency_quantile: str = Field(
        default=_DEFAULTS["latency_quantile"],
        description="A latency quantile ($quantile): the EPP histogram, newest name first, "
        "then each engine's e2e histogram.",
    )
    latency_requests: str = Field(
        default=_DEFAULTS["latency_requests"],
        description="Requests in the window: below scrape.min_latency_requests latency is unknown.",
    )

    @field_validator("*")
    @classmethod
    def _renders(cls, value: str, info: ValidationInfo) -> str:
        quantile = info.field_name == "latency_quantile"
        if info.field_name == "window":
            if seconds(value) is None:  # was read as 1m without a word
                raise ValueError(f"{value}: no rate window (at least 4 scrape intervals: 1m)")
            if (seconds(value) or 0.0) > MAX_WINDOW:
                raise ValueError(f"longer than {MAX_WINDOW // 86400} days: Prometheus keeps 15")
            return value
        if (why := renders(value, quantile)) is not None:
            raise ValueError(why)
        return value
