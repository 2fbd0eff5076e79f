"""The pod runner lives in playground/podrunner.py (the playground's node agent builds on it);
this name stays for the tests that import it from here."""

from playground.podrunner import (
    RUNTIMES,
    ContainerConfigError,
    PodRunError,
    PodRunner,
    RunningPod,
    expand,
    make_runner,
    secret_key,
)

__all__ = ["RUNTIMES", "ContainerConfigError", "PodRunError", "PodRunner", "RunningPod",
           "expand", "make_runner", "secret_key"]
