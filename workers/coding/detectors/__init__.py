"""The coding agent's detectors (found by `workers.detectors.registry` through `workers.discovery`)."""
