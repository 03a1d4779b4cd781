"""Recording from inside training frameworks, with one line in the trainer's callbacks.

* ``hookdbg.integrations.lightning.HookdbgCallback`` for PyTorch Lightning
  (``pip install 'hookdbg[lightning]'``);
* ``hookdbg.integrations.transformers.HookdbgCallback`` for the Hugging Face Trainer
  (``pip install 'hookdbg[transformers]'``).

Each module imports its framework; this package imports neither, so the rest of
hookdbg never needs them.
"""
