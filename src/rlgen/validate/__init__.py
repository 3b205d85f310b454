"""`rlgen validate`: hypothesis-drawn cases (``cases``), an engine's logprobs compared with the hf reference
(``compare``), where the engines run (``engines``), and the run with its report (``run``)."""
