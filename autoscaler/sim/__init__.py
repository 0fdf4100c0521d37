"""Trace-driven cluster simulator: workloads, job replay from the Pollux traces, metrics.

See :mod:`autoscaler.sim.engine` for the semantics, :mod:`autoscaler.sim.workload` for the
workload format, :mod:`autoscaler.sim.results` for what is recorded and
:mod:`autoscaler.sim.runner` for running many simulations in parallel.
"""
