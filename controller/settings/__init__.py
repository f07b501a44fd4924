"""One typed Settings object: the schema (``schema``, with ``queries`` for the PromQL templates),
loading from a YAML file and the environment (``loading``), the checks between fields
(``checks``) and of the files the settings name (``files``). Import what you need from here."""

from controller import CONFIG_ENV
from controller.settings.checks import cross_field_problems
from controller.settings.durations import Duration, parse_duration
from controller.settings.files import file_problems
from controller.settings.loading import build_settings, load_settings, read_yaml
from controller.settings.queries import PrometheusQueries
from controller.settings.schema import (
    ENV_PREFIX,
    AnnotationURLSettings,
    ClusterSettings,
    HealthSettings,
    HTTPRouteTarget,
    InferencePoolRef,
    KubernetesSettings,
    LeaderSettings,
    LogSettings,
    PodDiscovery,
    PrometheusSource,
    Querier,
    ScrapeSettings,
    ServerSettings,
    ServiceRef,
    Settings,
    WeightSettings,
    moved,
)

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "AnnotationURLSettings",
    "ClusterSettings",
    "Duration",
    "HTTPRouteTarget",
    "HealthSettings",
    "InferencePoolRef",
    "KubernetesSettings",
    "LeaderSettings",
    "LogSettings",
    "PodDiscovery",
    "PrometheusQueries",
    "PrometheusSource",
    "Querier",
    "ScrapeSettings",
    "ServerSettings",
    "ServiceRef",
    "Settings",
    "WeightSettings",
    "build_settings",
    "cross_field_problems",
    "file_problems",
    "load_settings",
    "moved",
    "parse_duration",
    "read_yaml",
]
