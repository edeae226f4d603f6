"""The agent swarm's detectors (found by `workers.detectors.registry` through `workers.discovery`)."""
