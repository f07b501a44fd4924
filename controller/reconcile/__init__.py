"""The reconcile loop (``loop``: a tick as stages) and what it keeps between ticks: the
clusters it reads (``fleet``), each target's memory (``memory``), realised share (``realised``),
and the log lines composed from one tick's report to the next (``journal``)."""
