"""Weight sync: after each applied optimizer step the learner's new weights reach every engine. Three processes
take part, and each part of this package runs in one of them:

- the driver (``rlgen train``'s own process) holds a transport (``transports``: object store, NCCL, CUDA IPC or
  LoRA adapters, picked from ``plan.transport`` by ``rlgen.runtime.start.transport.make_transport``) and calls
  the actors;
- the learner actors export, pack and send their weights (``sender.WeightSender``, a mixin of the learner actor;
  ``rlgen.learners.sending`` tells it which weights the policy is);
- the engine actors take them in (``rlgen.engines.vllm.updates``, the engine's own calls behind the capability
  protocols of ``rlgen.engines.contract``), and each vLLM worker process inside an engine loads them into the live
  model (``receiver``, run there through vLLM's ``collective_rpc``).

Shared by all three: how weights are cut into buckets (``layout``), the resident CUDA IPC buffer's layout and
handles (``ipc_buffer``), and the errors and waits that always end (``waits``).

One update over NCCL, as ``rlgen.runtime.loop`` drives it at the end of a step:

1. At set-up, the runtime's ``make_transport(plan, cfg)`` checks that the engine kind claims ``ReceivesNccl``;
   ``transport.setup(learner, engines, names)`` reads the learner's weight names (``WeightSender.weight_meta``)
   and forms one NCCL group: every engine's ``init_weight_transfer`` and the learner's ``init_nccl_sender`` run
   at once. ``transport.start()`` sends the starting weights once, so the group's first-use costs stay out of
   step 0.
2. Colocated engines give their GPU to the learner while it trains (``transport.sleep_engines()``: the CUDA IPC
   and LoRA adapter transports; the others have nothing to do here).
3. The learner's step is applied: ``transport.push(version, in_flight=...)`` calls, at once, every engine's
   ``receive_weights`` (which, in flight, pauses the engine's running requests inside its own call and has each
   vLLM worker run ``receiver.receive_nccl_on_worker``) and the learner's ``send_weights_nccl`` (one packed
   broadcast of ``layout.NUM_BUFFERS`` alternating buffers). Every engine drops its prefix cache and takes the
   version; ``waits.check_versions`` checks that all did. A ZeRO-3 group's other ranks join the gathers
   (``drain_weights``).
4. A skipped step (or a run that halts) sends nothing: ``transport.wake_engines()`` brings sleeping engines back
   on their old weights.

The other transports follow the same calls: the object store's ``push`` returns the engines' updates as
``PushResult.pending`` (each engine applies its update before its next generate, so the driver does not wait),
CUDA IPC packs the learner's resident buffer chunk by chunk and has the engines it leads load each chunk
(``receiver.load_ipc_on_worker``), and LoRA adapters send each version as an adapter through the object store.
An engine that dies is re-created and joined again by ``transport.replace_engine``. docs/weight_sync.md has each
transport step by step.
"""
