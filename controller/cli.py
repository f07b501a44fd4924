"""``weight-controller run | once | replay | check-config | simulate | status | demo``.

A bad config exits 2 with one ``field: reason`` line per problem on stderr, no traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from controller import CONFIG_ENV, __version__
from controller.errors import ConfigError

# Everything else is imported where a command needs it: --version, check-config and status
# start fast, without loading the Kubernetes client, aiohttp's server or pydantic-settings.
if TYPE_CHECKING:
    from controller.settings import Settings

EXIT_CONFIG = 2


class _Parser(argparse.ArgumentParser):
    """Argument errors as one line and exit status 2, like every other bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_CONFIG, f"{self.prog}: error: {message} (see --help)\n")


def _seconds(text: str) -> float:
    """A finite number of seconds above 0 (``nan``, ``-5`` and ``0`` ran, then crashed or
    exited after one tick: found by an attack)."""
    return _number(text, float, 0.0, strict=True)


def _delay(text: str) -> float:
    """A finite number of seconds, 0 or more."""
    return _number(text, float, 0.0, strict=False)


COUNT_MAX = 1_000_000


def _count(text: str) -> int:
    """A whole number, 1 or more, and at most ``COUNT_MAX`` (more seeds or processes than
    that is a typo, and 400 digits overflowed a C integer)."""
    value = int(_number(text, int, 0, strict=True))
    if value > COUNT_MAX:
        raise argparse.ArgumentTypeError(f"{text[:20]!r}: must be at most {COUNT_MAX}")
    return value


def _number(text: str, kind: type[float] | type[int], minimum: float, strict: bool) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    finite = kind is int or math.isfinite(value)  # an int of 400 digits overflows isfinite
    if not (finite and (value > minimum if strict else value >= minimum)):
        bound = f" and above {minimum:g}" if strict else f", {minimum:g} or more"
        raise argparse.ArgumentTypeError(f"{text!r}: must be finite{bound}")
    return value


def _parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--config", type=Path, help=f"YAML settings file (default: ${CONFIG_ENV})")
    parser = _Parser(
        prog="weight-controller",
        description="Steer LLM traffic away from clusters under KV-cache pressure.",
    )
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", parents=[common], help="the daemon: reconcile every interval")
    run.add_argument("--dry-run", action="store_true", help="compute and export, write nothing")
    run.add_argument(
        "--leader-elect", action="store_true", help="take a Lease; only the leader writes"
    )
    run.add_argument("--kubeconfig", type=Path, help="outside a pod: this kubeconfig")
    run.add_argument(
        "--metrics-bind-address", help="host:port for /metrics and /debug/state (server.bind)"
    )
    run.add_argument(
        "--health-probe-bind-address",
        help="host:port for /healthz and /readyz, plain HTTP (server.probe_bind)",
    )
    run.add_argument("--context", help="kubeconfig context")
    once = sub.add_parser(
        "once", parents=[common], help="one reconcile, printed as JSON; writes nothing by default"
    )
    once.add_argument("--apply", action="store_true", help="write the decided weights")
    replay = sub.add_parser(
        "replay",
        parents=[common],
        help="what it would have done over a window of the fleet's history; writes nothing",
    )
    replay.add_argument("--start", required=True, help="RFC 3339 time, or unix seconds")
    replay.add_argument("--end", required=True, help="RFC 3339 time, or unix seconds")
    replay.add_argument(
        "--step",
        help="a tick every STEP (e.g. 1m) instead of every interval, no shorter than it: "
        "a long window replays faster, but the loop's counts, filters and waits are in "
        "ticks, so it is not the live loop tick by tick",
    )
    replay.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a weights setting to replay with instead of the config's, e.g. --set settle=30s",
    )
    replay.add_argument(
        "--querier",
        help="a Prometheus or Thanos holding the series of the clusters the config scrapes "
        "(each by its name as the value of --cluster-label)",
    )
    replay.add_argument(
        "--cluster-label",
        default="cluster",
        help="with --querier: the label whose value is a scraped cluster's name (cluster)",
    )
    replay.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="also replay a candidate weights setting on the same history, side by side, "
        "over the replay's own settings (the config's, with --set); repeat for more "
        "candidates, KEY=VALUE,KEY=VALUE for one of several settings",
    )
    loop = replay.add_mutually_exclusive_group()
    loop.add_argument(
        "--recorded",
        metavar="NAME=WEIGHT,...",
        help="the split in force while the history was recorded, every cluster named (the "
        "even split if not given): each cluster's recorded load is moved with its replayed "
        "share over this one",
    )
    loop.add_argument(
        "--open-loop",
        action="store_true",
        help="feed the recorded signals as they were, not moved with the replayed weights",
    )
    replay.add_argument(
        "--target",
        metavar="KEY",
        action="append",
        default=[],
        help="a target to replay, weighed as the controller's own record had it (its "
        "weight_controller_target_share) and set beside it, as its /metrics names it "
        "(KIND/NAMESPACE/NAME); repeat for more; without it, every target the record holds",
    )
    replay.add_argument("--json", type=Path, help="also write every tick and the summary here")
    replay.add_argument(
        "--plot", type=Path, help="draw weights and KV per cluster over the window (PNG)"
    )
    check = sub.add_parser("check-config", help="validate a config file, print it normalised")
    check.add_argument("path", type=Path)
    _simulate_parser(sub)
    _status_and_demo_parsers(sub)
    return parser


def _simulate_parser(sub: Any) -> None:
    simulate = sub.add_parser(
        "simulate", help="closed-loop simulation: ours vs baselines, scored per scenario"
    )
    simulate.add_argument("--scenario", default="all", help="a scenario name, or 'all'")
    simulate.add_argument("--seed", type=int, default=1, help="the first seed")
    simulate.add_argument("--seeds", type=_count, default=5, help="how many seeds (median, worst)")
    simulate.add_argument(
        "--policies",
        default="",
        help="comma-separated subset of ours,integral,proportional,naive,static (default: all)",
    )
    simulate.add_argument(
        "--workers", type=_count, default=None, help="processes (default: one per core)"
    )
    simulate.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    simulate.add_argument("--interval", type=_seconds, default=10.0, help="scrape/tick, seconds")
    simulate.add_argument(
        "--delay", type=_delay, default=10.0, help="publish-to-effect delay, seconds"
    )
    simulate.add_argument("--duration", type=_seconds, default=None, help="simulated seconds")
    simulate.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a weights setting for 'ours', e.g. --set settle=30s",
    )
    simulate.add_argument("--json", type=Path, help="also write the scores as JSON here")
    simulate.add_argument("--plot", type=Path, help="draw weight, KV and latency (PNG)")


def _status_and_demo_parsers(sub: Any) -> None:
    status = sub.add_parser("status", help="a running controller's state, as tables")
    status.add_argument("--url", default="http://127.0.0.1:8080", help="its metrics address")
    status.add_argument(
        "--explain", action="store_true", help="also each ref's score and its factors"
    )
    status.add_argument(
        "--token-file",
        type=Path,
        help="send this file's token (a deployed controller asks for one: server.authenticate)",
    )
    status.add_argument(
        "--ca-file", type=Path, help="verify its HTTPS certificate with this CA bundle"
    )
    status.add_argument("-o", "--output", choices=["table", "json"], default="table")
    status.add_argument(
        "--watch", type=_seconds, metavar="SECONDS", help="redraw every SECONDS until Ctrl-C"
    )
    demo = sub.add_parser("demo", help="simulated clusters on loopback + the controller")
    demo.add_argument("--duration", type=_seconds, default=None, help="seconds, then exit")
    demo.add_argument("--interval", type=_seconds, default=1.0, help="reconcile period, seconds")
    demo.add_argument("--bind", default="127.0.0.1:8080", help="our /metrics address")
    demo.add_argument("--verbose", action="store_true", help="also print the structured logs")
    demo.add_argument(
        "--seed", type=int, default=0, help="the simulated clusters' noise (same seed: same story)"
    )


EXIT_RUNTIME = 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except OSError as exc:  # e.g. the metrics port is taken: say so, no traceback
        print(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return EXIT_RUNTIME


def lean_metrics() -> None:
    """No ``*_created`` series on any registry of this process: a third of ``/metrics`` at 200
    clusters, and Prometheus's ``rate()`` has no use for them (the process's own start time is
    ``process_start_time_seconds``). prometheus_client's switch is process-wide, so it is set
    here, once, at start-up (of the commands that run the loop: the quick ones never load
    prometheus_client)."""
    from prometheus_client import disable_created_metrics

    disable_created_metrics()  # type: ignore[no-untyped-call]


def _dispatch(args: argparse.Namespace) -> int:
    try:
        return _command(args)
    except ConfigError as exc:
        for line in exc.lines:
            print(f"config error: {line}", file=sys.stderr)
        return EXIT_CONFIG


def _command(args: argparse.Namespace) -> int:
    if args.command == "check-config":
        return _check_config(args.path)
    if args.command == "status":
        access = (args.token_file, args.ca_file)
        try:
            return asyncio.run(_status(args.url, args.explain, args.output, args.watch, access))
        except KeyboardInterrupt:  # how --watch ends: no traceback, the shell's own code
            return 128 + signal.SIGINT
    lean_metrics()  # each command from here runs the loop, with a registry (run serves it)
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "demo":
        from controller.demo.runner import run_demo

        return asyncio.run(
            run_demo(args.duration, args.interval, args.bind, args.verbose, seed=args.seed)
        )
    from controller import logs
    from controller.app import serve_forever
    from controller.settings import file_problems, load_settings

    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        if args.config is None and not os.environ.get(CONFIG_ENV):
            hint = (
                f"no settings file given: --config FILE or ${CONFIG_ENV} (config/example.yaml "
                "shows every field; `weight-controller demo` runs without one)"
            )
            raise ConfigError([*exc.lines, hint]) from None
        raise
    if problems := file_problems(settings):
        raise ConfigError(problems)  # before anything starts: one line each, exit 2
    if args.command == "once":  # stdout carries the JSON; logs go to stderr
        logs.configure(settings.log.level, settings.log.format, sys.stderr)
        return asyncio.run(_once(settings, args.apply))
    if args.command == "replay":  # stdout carries the summary; the loop's logs are quiet
        logs.configure("critical", "console", sys.stderr)
        return asyncio.run(_replay(settings, args))
    logs.configure(settings.log.level, settings.log.format)
    settings = with_flags(settings, args)
    _log_config(settings, args.config, args.dry_run)
    asyncio.run(serve_forever(settings, dry_run=args.dry_run))
    return 0


def _log_config(settings: Settings, path: Path | None, dry_run: bool) -> None:
    """What this process runs with: a digest to compare replicas by, never a secret (tokens
    live in files the settings only name, and URL credentials are refused)."""
    import structlog

    from controller.cgroup import memory_limit

    normalised = json.dumps(settings.model_dump(mode="json"), sort_keys=True)
    log = structlog.get_logger("controller.cli")
    log.info(
        "config loaded",
        source=str(path) if path else os.environ.get(CONFIG_ENV),
        digest=hashlib.sha256(normalised.encode()).hexdigest()[:16],
        version=__version__,
        clusters=len(settings.clusters),
        interval=settings.interval,
        kubernetes=settings.kubernetes.enabled,
        leader_election=settings.leader_election.enabled,
        dry_run=dry_run,
        memory_limit_bytes=memory_limit(),  # its container's limits.memory (None: none)
    )
    named = path or (Path(os.environ[CONFIG_ENV]) if os.environ.get(CONFIG_ENV) else None)
    for line in _moved(named):
        log.warning("config field moved", detail=line)


def with_flags(settings: Settings, args: argparse.Namespace) -> Settings:
    """Command-line flags override the file and the environment."""
    kube, election = settings.kubernetes, settings.leader_election
    if args.kubeconfig is not None or args.context is not None:
        kube = kube.model_copy(
            update={
                "kubeconfig": args.kubeconfig or kube.kubeconfig,
                "context": args.context or kube.context,
            }
        )
    if args.leader_elect:
        from controller.settings.checks import leader_problems

        dumped = settings.model_dump(mode="json")
        if problems := leader_problems(dumped["kubernetes"], dumped["leader_election"], True):
            raise ConfigError([f"{p} (--leader-elect)" for p in problems])
        election = election.model_copy(update={"enabled": True})
    served = settings.server
    binds = {"bind": args.metrics_bind_address, "probe_bind": args.health_probe_bind_address}
    if given := {k: v for k, v in binds.items() if v is not None}:
        from pydantic import ValidationError

        from controller.settings import ServerSettings

        flags = {"bind": "--metrics-bind-address", "probe_bind": "--health-probe-bind-address"}
        try:  # validated as the file's would be
            served = ServerSettings(**{**served.model_dump(), **given})
        except ValidationError as exc:
            lines = [f"{flags.get(str(e['loc'][0]), 'server')}: {e['msg']}" for e in exc.errors()]
            raise ConfigError([line.replace("Value error, ", "") for line in lines]) from None
    update = {"kubernetes": kube, "leader_election": election, "server": served}
    return settings.model_copy(update=update)


def _simulate(args: argparse.Namespace) -> int:
    from controller import logs
    from controller.simulation.plot import plot
    from controller.simulation.report import (
        EXTRA_POLICIES,
        POLICIES,
        Job,
        as_json,
        jobs_for,
        run_all,
        run_job,
        summarise,
        table,
    )
    from controller.simulation.scenarios import SCENARIOS

    logs.configure("critical", "console", sys.stderr)  # the table is the output
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario {unknown[0]!r}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return EXIT_CONFIG
    policies = args.policies.split(",") if args.policies else list(POLICIES)
    known = (*POLICIES, *EXTRA_POLICIES)
    if any(p not in known for p in policies):
        print(f"unknown policy in {args.policies!r}; known: {', '.join(known)}", file=sys.stderr)
        return EXIT_CONFIG
    bad = [item for item in args.set if "=" not in item or not item.split("=", 1)[0]]
    if bad:
        print(f"weight-controller: error: --set {bad[0]!r}: expected KEY=VALUE", file=sys.stderr)
        return EXIT_CONFIG
    overrides = tuple((k, v) for k, v in (item.split("=", 1) for item in args.set))
    from pydantic import ValidationError

    from controller.settings import WeightSettings

    try:
        WeightSettings.model_validate(dict(overrides))
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"])
            print(
                f"weight-controller: error: --set weights.{where}: {error['msg']}", file=sys.stderr
            )
        return EXIT_CONFIG
    seeds = range(args.seed, args.seed + args.seeds)
    common = {
        "interval": args.interval,
        "delay": args.delay,
        "overrides": overrides,
        "duration": args.duration,
    }
    jobs = jobs_for(names, policies, list(seeds), **common)
    outcomes = run_all(jobs, workers=args.workers, progress=sys.stderr)
    summaries = summarise(outcomes)
    print(table(summaries, markdown=args.markdown))
    if args.json is not None:
        args.json.write_text(json.dumps(as_json(summaries), indent=2) + "\n")
    if args.plot is not None:
        shown = [p for p in ("ours", "integral", "naive") if p in policies] or policies[:1]
        traces = {
            p: asyncio.run(run_job(Job(names[0], p, args.seed, **common), keep_trace=True)).trace
            for p in shown
        }
        plot(SCENARIOS[names[0]](), {p: t for p, t in traces.items() if t is not None}, args.plot)
        print(f"\nplot written to {args.plot}")
    return 0


async def _status(
    url: str,
    explain: bool,
    output: str,
    watch: float | None,
    access: tuple[Path | None, Path | None] = (None, None),
) -> int:
    import ssl

    import aiohttp

    from controller.status import STATE_PATH, StateError, fetch_state, render

    # Watching ends on Ctrl-C by this flag, raced with each fetch and each wait, not by
    # asyncio.run cancelling whatever await it lands in (a run under load once went on
    # watching for 30 s after SIGINT: a cancellation lost somewhere under the fetch). A
    # second Ctrl-C raises at once, as Python's own handler does.
    stop = asyncio.Event()
    if watch is not None:
        loop = asyncio.get_running_loop()

        def interrupted() -> None:
            stop.set()
            loop.remove_signal_handler(signal.SIGINT)

        loop.add_signal_handler(signal.SIGINT, interrupted)
    while True:
        shown = ""
        fetching = asyncio.ensure_future(fetch_state(url, token_file=access[0], ca_file=access[1]))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({fetching, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if stop.is_set():  # the fetch in flight is dropped, not waited for
            fetching.cancel()
            return 128 + signal.SIGINT
        try:
            state = fetching.result()
        except (aiohttp.ClientError, OSError, ssl.SSLError, ValueError, StateError) as exc:
            error = str(exc) or type(exc).__name__  # ValueError: a token file with no token
            print(f"error: cannot read {url}{STATE_PATH}: {error}", file=sys.stderr)
        else:
            try:
                shown = (
                    json.dumps(state, indent=2)
                    if output == "json"
                    else render(state, explain=explain)
                )
            except (KeyError, TypeError, ValueError, AttributeError) as exc:  # another version's
                error = f"{type(exc).__name__}: {exc}"
                print(
                    f"error: cannot show {url}{STATE_PATH} ({error}); -o json prints it as it came",
                    file=sys.stderr,
                )
        if watch is None:
            if shown:
                print(shown)
            return 0 if shown else EXIT_RUNTIME
        if shown:  # watching: a frame that failed is said, and the next one reads again
            if output == "table":
                print("\033[2J\033[H", end="")  # clear the terminal between frames
            print(shown, flush=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.5, watch))
        if stop.is_set():
            return 128 + signal.SIGINT


def _check_config(path: Path) -> int:
    import yaml

    from controller.settings import file_problems, load_settings

    settings = load_settings(path)
    problems = file_problems(settings)
    if problems:
        raise ConfigError(problems)
    for line in _moved(path):
        print(f"config note: {line}", file=sys.stderr)
    print(yaml.safe_dump(settings.model_dump(mode="json"), sort_keys=False), end="")
    return 0


def _moved(path: Path | None) -> list[str]:
    """The fields the file or the environment sets where they used to be
    (``settings.moved``)."""
    from controller.settings import moved, read_yaml

    return moved(read_yaml(path) if path is not None else {}, os.environ)


def _when(flag: str, text: str) -> float:
    """``--start``/``--end``: unix seconds, or an RFC 3339 time (UTC when it names no zone)."""
    from datetime import UTC, datetime

    try:
        found = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            problem = f"{flag} {text!r}: not unix seconds or an RFC 3339 time"
            raise ConfigError([problem]) from None
        found = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
    # nan, inf and 1e300 are no time (a traceback, or memory for every step to them), nor
    # are year 1 or 9999-12-31T23:00-01:00 (a review)
    if not 0 <= found < _LAST_TIME:
        raise ConfigError([f"{flag} {text!r}: not a time from 1970 to 9999-12-31 (UTC)"])
    return found


_LAST_TIME = 253402300800.0  # 10000-01-01T00:00:00Z, past RFC 3339's last year


def _step(text: str) -> float:
    """``--step``: a duration (``30s``, ``1m``, seconds)."""
    from controller.settings.durations import seconds

    found = seconds(text)
    if found is None:
        raise ConfigError([f"--step {text!r}: not a duration (30s, 1m, or seconds)"])
    return found


async def _replay(settings: Settings, args: argparse.Namespace) -> int:
    import aiohttp

    from controller import replay
    from controller.app import settle_collector

    start, end = _when("--start", args.start), _when("--end", args.end)
    step = None if args.step is None else _step(args.step)
    where = (args.querier, args.cluster_label, step)
    own = settings.weights.model_dump(mode="json", exclude_unset=True)  # as the file gave them
    given = replay.once_each(args.set, "--set")
    chosen = replay.replay_settings(settings, replay.check_overrides(given, own), *where)
    if len(set(args.compare)) < len(args.compare):
        twice = next(c for c in args.compare if args.compare.count(c) > 1)
        raise ConfigError([f"--compare {twice!r}: given twice"])
    candidates = {
        # a candidate is the replay's own settings (the config's, with --set) with its change
        item: replay.replay_settings(
            settings,
            replay.check_overrides(
                [*given, *replay.once_each(item.split(","), "--compare")], own, "--compare"
            ),
            *where,
        )
        for item in args.compare
    }
    names = [c.name for c in chosen.clusters]
    replay.recorded_split(args.recorded, names)  # a bad one refused before anything is read
    try:
        if args.plot is not None:
            replay.plotting(args.plot)
            replay.writable("--plot", args.plot)
        if args.json is not None:
            replay.writable("--json", args.json)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            history = await replay.read_history(chosen, start, end, session)
            founds = await replay.record_of(chosen, start, end, session, args.target)
        # each target the record holds, weighed as the live loop weighed it (its refs, its
        # clusters); without one, the implicit target over the config's clusters
        held, unheld = replay.held_apart(founds, named=bool(args.target))
        if args.recorded is not None and len(held) > 1:
            raise replay.ReplayError(
                f"--recorded gives one split for every target, and the record holds "
                f"{len(held)}: name the one it is for with --target"
            )
        # what was read is kept for good, as the daemon keeps what start-up made: the
        # collector's passes over a week's history would cost more than the loop itself
        settle_collector()
        runs = [
            await replay.replay_target(
                chosen,
                candidates,
                history,
                found,
                args.recorded,
                args.open_loop,
                ticks=None if args.json is None else replay.spool_directory(args.json),
                trace=args.plot is not None,
            )
            for found in held
        ]
    except replay.ReplayError as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    gaps = replay.gaps(history)
    label = ",".join(args.set) or "the config's"
    blocks: list[dict[str, Any]] = []
    for note in unheld:
        print(f"({note})\n")
    several = len(runs) > 1
    for index, one in enumerate(runs):
        recorded = replay.record_row(one.found, one.weighed, one.summary.hours)
        loop = replay.loop_line(one.response)
        weighed = set(one.weighed)
        mine = {q: {n: g for n, g in by.items() if n in weighed} for q, by in gaps.items()}
        more = [*replay.target_lines(one.target), *replay.gap_lines(mine)]
        if index:
            print()
        title = (one.target.key if one.target else "the config's clusters") if several else ""
        print(replay.table(one.summary, one.weighed, loop, more, title))
        print(replay.record_line(recorded))
        if one.compared:
            print()
            print(replay.compared({label: one.summary, **one.compared}, one.weighed))
        blocks.append(
            {
                "target": one.target.key if one.target is not None else None,
                "summary": one.summary.row(one.weighed),
                "compared": {item: other.row(one.weighed) for item, other in one.compared.items()},
                "loop": loop,
                "recorded": recorded,
            }
        )
    separate = replay.shared(runs) and not args.open_loop
    if separate:
        print(f"\n({replay.SEPARATE})")
    if args.plot is not None:  # before the JSON: a plot that fails leaves nothing written
        traces = [(r.target.key if r.target else "the config's clusters", r.trace) for r in runs]
        try:
            replay.plot(traces, args.plot, closed=not args.open_loop)
        except replay.ReplayError as exc:
            print(f"replay: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        print(f"\nplot written to {args.plot}")
    if args.json is not None:
        document = {
            "targets": blocks,
            "not_replayed": unheld,
            "separate": replay.SEPARATE if separate else None,
            "gaps": {
                query: {n: {"ticks": m, "first": first} for n, (m, first) in by_name.items()}
                for query, by_name in gaps.items()
            },
        }
        replay.write_document(args.json, document, [r.ticks for r in runs if r.ticks is not None])
    for one in runs:
        if one.ticks is not None:
            one.ticks.close()
    return _read_whole(runs)


def _read_whole(runs: Sequence[Any]) -> int:
    """0 if every tick read its clusters' KV; else the summary above counts ticks the querier
    failed to answer (after its retries) as unread, and the exit says so: found by an attack,
    a replay that read nothing at 91% of its ticks printed 0.0 writes/h and exited 0."""
    from controller.replay import utc

    failed = {
        one.target.key if one.target else "the config's clusters": one.summary
        for one in runs
        if "kv_mean" in one.summary.failed
    }
    for title, summary in failed.items():
        ticks, first, why = summary.failed["kv_mean"]
        print(
            f"replay: {title}: the querier failed to answer kv_mean at {ticks} of "
            f"{summary.ticks} ticks ({100 * ticks / summary.ticks:.0f}%), the first at "
            f"{utc(first)}: {why}; the figures count those ticks as unread",
            file=sys.stderr,
        )
    return EXIT_RUNTIME if failed else 0


async def _once(settings: Settings, apply: bool) -> int:
    from controller.app import Controller
    from controller.render import report_json

    async with Controller(settings, serve=False, dry_run=not apply) as controller:
        report = await controller.once()
    print(json.dumps(report_json(report), indent=2))
    return 0
