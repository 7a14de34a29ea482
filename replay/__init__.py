"""KV replay: rebuild the prefix caches of conversations whose shards moved, on the survivors'
inference engines, in spare prefill capacity only. Imports only ``eventlog``.

Public API (import from the modules): ``scheduler.ReplayScheduler`` (what to replay next,
fairly across tenants), ``capacity`` (spare prefill per engine from its own metrics:
``CapacityController``, ``CapacityPoller``, the worker's ``CapacityGate``), ``worker.ReplayWorker``
(pull a job when there is spare, prefill the transcript, report), ``transcripts`` (the port it
reads transcripts through; ``transcripts_http`` its REST adapter), ``chat`` (a transcript
rendered as the exact chat request the live path will send), ``bus`` (the job bus port, the
in-process and Kafka adapters), ``engines`` (the engine port, vLLM over HTTP, the simulator),
``affinity.AffinityTable`` (which worker's engine holds a conversation's KV warm).

Where a change goes: a new inference engine implements ``engines.base.InferenceEngine``
(``prefill``, ``metrics``, ``self_check``) and is chosen in ``services.bootstrap.replay``; a new
bus implements ``bus.port.JobBus``.
"""
