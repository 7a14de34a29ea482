"""Inference engines for replay: the port, vLLM over HTTP, and a simulated engine.

Public names are imported from their modules (``replay.engines.base``,
``replay.engines.vllm_http``, ``replay.engines.simulated``, ``replay.engines.sim_server``); this
package imports nothing itself, so importing it stays cheap.
"""
