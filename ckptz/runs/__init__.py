"""Runs over trees of files: what the library's commands do around the pipeline.

:mod:`.tree` finds and selects files, :mod:`.plan` decides what becomes what, :mod:`.run`
and :mod:`.jobs` carry a plan out (engines, locks, stops, files in parallel),
:mod:`.compare` checks trees, :mod:`.streams` handles pipes, :mod:`.estimate` answers
``--dry-run``, :mod:`.lock` holds ``flock``\\ s, and :mod:`.results` and :mod:`.progress`
are what a run reports. Under ``torchrun``, :mod:`.share` says which rank does which file,
:mod:`.distributed` makes the ranks one run, and :mod:`.launch` starts ranks for ``--nproc``. Each file's bytes go through :mod:`ckptz.pipeline`; file metadata
is :mod:`ckptz.meta`'s.
"""
