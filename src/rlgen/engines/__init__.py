"""Engines: the protocol every engine actor speaks (``base``), the kinds by name (``registry``), and one package
per built-in kind (``hf``, ``vllm``, ``remote``), each holding its spec and its actor."""
