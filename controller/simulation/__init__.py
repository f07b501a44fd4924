"""A closed-loop simulator that drives the real health and weights code (``simulate``)."""
