"""The policy benchmark: the operator's policy against every static choice and the phase oracle.

`run.run_scenario` replays one scenario file in simulated time; `suite.run_suite` runs many
in parallel and `report` renders the table, JSON, CSV and plots. See BENCHMARK.md for the
binding definitions and `engine` for how strategies are scored.
"""
