"""weight-controller: steer LLM traffic away from overloaded clusters."""

__version__ = "0.1.0"
