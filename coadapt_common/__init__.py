"""The kernel that ``autoscaler``, ``providers`` and ``trainer`` share.

One place each for: the injected clock (:mod:`coadapt_common.clock`), the root of every error
coadapt raises on purpose (:mod:`coadapt_common.errors`), atomic file writes
(:mod:`coadapt_common.atomic`) and Linux process inspection (:mod:`coadapt_common.procfs`).

It is standard library only and imports none of the three packages above (the import-rule test,
``tests/test_imports.py``, enforces both directions), so every package may depend on it without
depending on any other. The one deliberate exception is ``providers/local_agent.py``, which runs
as a standalone script and keeps its own tiny atomic writer.
"""
