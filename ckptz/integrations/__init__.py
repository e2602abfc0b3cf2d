"""Trainer integrations, each imported only by those who ask for it.

- :mod:`ckptz.integrations.transformers`: a Hugging Face ``TrainerCallback`` that compresses
  every saved ``checkpoint-N`` folder in place, in the background, and :func:`resume
  <ckptz.integrations.transformers.resume>` to train on from one (extra ``ckptz[hf]``).
- :mod:`ckptz.integrations.lightning`: a Lightning ``CheckpointIO`` that writes and reads
  ``.ckpt`` files as containers (extra ``ckptz[lightning]``).

Nothing here is imported by ``import ckptz`` or by the command line.
"""
