"""A real Ray head on loopback whose actors report as vLLM's Ray stat logger does, for
``tests/process/test_ray.py``:

    python -m tests.support.ray_node '<spec as JSON>'

The spec: ``port`` (Ray's metrics-export port), ``report_ms`` (how often workers export:
Ray's ``metrics_report_interval_ms``; its default is 10 s, the test's is shorter), ``bounds``
(the e2e histogram's) and ``replicas``, each ``{replica, model, kv, waiting, running, blocks,
block_size, completed}``.

Each replica is an actor reporting through ``ray.util.metrics`` as ``RayPrometheusStatLogger``
(``vllm/v1/metrics/ray_wrappers.py``) names and tags vLLM's metrics: ``vllm:`` names with
``:`` made ``_`` (Ray exports nothing under a name with a colon: tried on Ray 2.60), tagged
``model_name`` and ``engine`` as vLLM labels them and ``ReplicaId`` as the wrapper adds it.
Its gauges are set again every 0.5 s, as vLLM's stat logger does on each step, except
``vllm_cache_config_info``, which vLLM sets once at start (Ray drops it once it is not set
again). Ray's metrics agent serves them on ``port`` with its ``ray_`` prefix and the
worker's own labels.

One JSON line on stdout per event (``{"ready": ...}``, ``{"restarted": ...}``); commands on
stdin, one JSON line each: ``{"restart": "<replica>", ...changes}`` starts another actor under
the same ``ReplicaId`` (a new worker) while the old one still reports, as a restarted
replica's old series linger on the page; ``{"stop": "<worker>"}`` kills the old one (its
series then go within Ray's time to live); ``{"quit": true}`` ends.

Ray binds its metrics agent to every address (it has no setting for it); the test reads it
on 127.0.0.1 only, and the head's own addresses are 127.0.0.1.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import ray
from ray.util.metrics import Gauge, Histogram

REFRESH = 0.5  # seconds between a replica's gauge updates


@ray.remote(num_cpus=0)
class Replica:
    def __init__(self, spec: dict[str, Any], bounds: list[float]) -> None:
        self._tags = {"model_name": spec["model"], "engine": "0", "ReplicaId": spec["replica"]}
        keys = tuple(self._tags)
        self._values = {
            "kv_cache_usage_perc": float(spec["kv"]),
            "num_requests_waiting": float(spec["waiting"]),
            "num_requests_running": float(spec["running"]),
        }
        self._gauges = {n: Gauge(f"vllm_{n}", n, tag_keys=keys) for n in self._values}
        # vLLM's info gauge: the cache config's fields and the engine, set once
        info = {
            "block_size": str(spec["block_size"]),
            "cache_dtype": "auto",
            "engine": "0",
            "num_gpu_blocks": str(spec["blocks"]),
            "ReplicaId": spec["replica"],
        }
        Gauge("vllm_cache_config_info", "cache config", tag_keys=tuple(info)).set(1, tags=info)
        e2e = Histogram("vllm_e2e_request_latency_seconds", "e2e", boundaries=bounds, tag_keys=keys)
        for _ in range(int(spec["completed"])):
            e2e.observe(0.7, tags=self._tags)
        self._set()
        threading.Thread(target=self._refresh, daemon=True).start()

    def _set(self) -> None:
        for name, value in self._values.items():
            self._gauges[name].set(value, tags=self._tags)

    def _refresh(self) -> None:
        while True:
            time.sleep(REFRESH)
            self._set()

    def worker(self) -> str:
        return str(ray.get_runtime_context().get_worker_id())


def say(**event: Any) -> None:
    print(json.dumps(event), flush=True)


def main() -> None:
    spec = json.loads(sys.argv[1])
    ray.init(
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        _metrics_export_port=spec["port"],
        num_cpus=1,
        object_store_memory=80 * 1024 * 1024,
        configure_logging=False,
        log_to_driver=False,
        _system_config={"metrics_report_interval_ms": spec["report_ms"]},
    )
    bounds = spec["bounds"]
    actors = {r["replica"]: Replica.remote(r, bounds) for r in spec["replicas"]}  # type: ignore[attr-defined]
    workers = {name: ray.get(a.worker.remote()) for name, a in actors.items()}
    say(ready=workers)
    old: dict[str, Any] = {}  # worker → its actor, replaced but still running
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("quit"):
            break
        if "stop" in command:
            ray.kill(old.pop(command["stop"]))
            say(stopped=command["stop"])
            continue
        name = command.pop("restart")
        old[workers[name]] = actors[name]
        before = next(r for r in spec["replicas"] if r["replica"] == name)
        actors[name] = Replica.remote({**before, **command}, bounds)  # type: ignore[attr-defined]
        was, workers[name] = workers[name], ray.get(actors[name].worker.remote())
        say(restarted=name, worker=workers[name], was=was)
    ray.shutdown()


if __name__ == "__main__":
    main()
