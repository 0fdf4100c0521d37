"""Integrations of coadapt's trainer with training frameworks.

Each integration lives in its own module and imports its framework there, never here: ``import
trainer`` and ``import trainer.integrations`` stay free of ``transformers`` and ``lightning``.

* :mod:`trainer.integrations.hf`: the Hugging Face ``transformers.Trainer``
  (``pip install 'coadapt[hf]'``);
* :mod:`trainer.integrations.lightning`: PyTorch Lightning's ``lightning.Trainer``
  (``pip install 'coadapt[lightning]'``).
"""

from __future__ import annotations
