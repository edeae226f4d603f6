"""Built-in benchmark suites, as task rows an environment validates (no Django: the control plane imports them)."""
