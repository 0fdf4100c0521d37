"""coadapt's decision plane: goodput model, speedup tables, policies, sizing, simulator.

The core modules here are pure (numbers in, plans out, no I/O, no clock). Heavy or optional
dependencies are imported lazily so that ``import autoscaler`` stays cheap.
"""

__version__ = "0.1.0"
