"""The example jobs shipped with the package, each ``examples/<job>/<job>.py`` + ``kappa.yaml``."""

#: the example jobs, by name (their folder under ``examples/``)
JOBS = ("rmi", "playback_sessions")
