"""``ckptz bench``: sample a checkpoint's components, time every codec on them, and say what
compression saves at the storage's speed (:mod:`.benchmark` runs it; :mod:`.sampling`,
:mod:`.measure`, :mod:`.savings` and :mod:`.storage` are its parts)."""
