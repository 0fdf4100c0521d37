"""The goodput model (numbers only): a job's throughput model and its fitting, statistical
efficiency and the batch optimiser, speedup tables, GPU types and interconnects. Imports no
other layer of ``autoscaler``."""
