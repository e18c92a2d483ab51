"""Planning a job before it runs: profile on the fleet clock, fit, predict time and $ per
fleet size and memory, recommend (``ebb plan``; docs/RESULTS-TOOLS.md, "Planning a job")."""
