"""Offline analysis for the simulator and the benchmarks (the cost floor, the frontier); the
product never imports it."""
