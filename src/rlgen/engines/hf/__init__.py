"""engine=hf: transformers' generate() in a Ray actor (``engine.HFEngine``). It runs anywhere, on CPU or one GPU,
takes weights through Ray's object store (or LoRA adapters, through PEFT: ``adapters``), and is the reference
`rlgen validate` compares other engines with."""

from rlgen.engines.registry import EngineSpec

ENGINE = EngineSpec(kind="hf", actor="rlgen.engines.hf.engine:HFEngine", reference=True, scores=True,
                    adapters=True, keeps_warm=True, episodes=True, cuts_short=True,
                    starting="an hf engine imports torch and transformers and loads the model's weights")
