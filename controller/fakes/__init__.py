"""Fake vLLM and EPP: realistic /metrics pages (``pages``) and loopback servers that serve them
(``clusters``). Neutral ground shared by the demo, the simulator and the tests; nothing in the
daemon's own path imports it."""
