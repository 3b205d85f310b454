"""The HTTP protocol of `rlgen serve` (``protocol``: routes' bodies, tensors and weights on the wire) and its
Python clients (``client``). Imports no torch at module level."""
