"""Engines: the contract every engine actor answers (``contract``: the base protocol and one per capability), the
kinds by name (``registry``), what engines raise (``base``), and one package per built-in kind (``hf``, ``vllm``,
``remote``), each holding its spec and its actor."""
