"""Trainer integrations, each imported only by those who ask for it.

- :mod:`ckptz.integrations.transformers` (also ``ckptz.hf``): a Hugging Face
  ``TrainerCallback`` that compresses every saved ``checkpoint-N`` folder in place, in the
  background, and :func:`enable <ckptz.integrations.transformers.enable>`, which lets
  ``from_pretrained`` and a ``Trainer`` resume read folders compressed in place, in memory
  (extra ``ckptz[hf]``).
- :mod:`ckptz.integrations.lightning`: a Lightning ``CheckpointIO`` that writes and reads
  ``.ckpt`` files as containers (extra ``ckptz[lightning]``).

Nothing here is imported by ``import ckptz`` (``ckptz.hf`` imports on first use) or by the
command line.
"""
