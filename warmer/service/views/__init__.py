"""What the API and the CLI show: boxes, readiness, routes, the admission gate, capacity."""
