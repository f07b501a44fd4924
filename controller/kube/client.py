"""An ApiClient: in-cluster service account in a pod, a kubeconfig otherwise."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from controller.errors import ConfigError
from controller.kube.sdk import client, config
from controller.settings import KubernetesSettings

SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


ApiClient = client.ApiClient


async def api_client(settings: KubernetesSettings) -> client.ApiClient:
    """In a pod (the service-account token and ``KUBERNETES_SERVICE_HOST`` are there) use the
    projected token — the client re-reads it as it rotates; elsewhere the kubeconfig."""
    configuration = client.Configuration()
    try:
        if settings.kubeconfig is None and _in_cluster():
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            await config.load_kube_config(
                config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
                context=settings.context,
                client_configuration=configuration,
            )
    except (config.ConfigException, OSError) as exc:
        where = settings.kubeconfig or "in-cluster service account / $KUBECONFIG"
        raise ConfigError([f"kubernetes: cannot load credentials from {where}: {exc}"]) from exc
    except (TypeError, ValueError, KeyError, AttributeError, yaml.YAMLError) as exc:
        # a file that is no kubeconfig ($KUBECONFIG, which check-config cannot see): the
        # client raises what its parsing hits (found by an attack)
        where = settings.kubeconfig or "$KUBECONFIG"
        detail = f"not a kubeconfig ({type(exc).__name__})"
        raise ConfigError([f"kubernetes: cannot load credentials from {where}: {detail}"]) from exc
    return client.ApiClient(tuned(configuration))


def tuned(configuration: client.Configuration) -> client.Configuration:
    """What every client of ours sets: no cap on its connections. Each watch holds one for
    up to its timeout (``informer.WATCH_SECONDS``), and kubernetes-asyncio's default cap of
    100 queued every LIST, write and Lease renewal behind 100 watches: 60 namespaces watched
    (120 informers) and the leader lost its Lease for good, nothing written (found by an
    attack). client-go multiplexes them over HTTP/2; here what runs at once is bounded by
    the configured scopes, the Lease and the writes' own limit. (aiohttp: 0 is no limit.)"""
    configuration.connection_pool_maxsize = 0
    return configuration


def _in_cluster() -> bool:
    return "KUBERNETES_SERVICE_HOST" in os.environ and SERVICE_ACCOUNT_TOKEN.exists()
