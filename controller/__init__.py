"""weight-controller: steer LLM traffic away from overloaded clusters."""

__version__ = "0.1.0"

# The environment variable that names the config file (here, so the CLI can say so in --help
# without importing the settings machinery).
CONFIG_ENV = "WEIGHT_CONTROLLER_CONFIG"
