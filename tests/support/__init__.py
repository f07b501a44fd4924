"""What the tests share: real servers on loopback (``servers``), the real captured pages
(``pages``), the Kubernetes API-server double enforcing the upstream CRDs (``apiserver``,
``crds``) and the objects the tests seed it with (``kube``), a real Prometheus
(``prometheus``), the daemon as a child process (``daemon``), and the shipped files read as
tests need them (``manifests``, ``observability``)."""
