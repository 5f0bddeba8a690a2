"""The checkpoint format and its durable files, without torch.

Layers, each importing only those below it: ``format`` (names, limits, the manifest and
safetensors-header parsers; no I/O), ``durable`` (the one atomic write, fsyncs, removal that
never follows a link, on :mod:`spotwise.dirfd`), ``write`` (a checkpoint's files, its manifest
and the publish step), ``read`` (the checks of listing and of the bytes, listing) and
``retention``; ``crcjoin`` joins the CRCs of pieces read apart, ``memory`` gives the fresh
memory a load reads into, ``writeway`` chooses between writing large files directly and through
the page cache. ``spotwise.runtime`` adds the torch side (packing tensors, loading);
``storage``, ``control`` and ``cli`` read checkpoints through this package, so reading a
manifest never loads torch.
"""
