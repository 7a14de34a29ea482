"""``convplane sim-engine serve``: run the simulated inference engine behind vLLM's HTTP API.

A simulator for demos and tests where no GPU exists: it reproduces prefill timing and prefix
caching (``replay.engines.sim_core``), not a model. Runs in real time (system clock).
"""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="The simulated inference engine (vLLM-shaped HTTP API, no GPU).")

    @group.command("serve")
    def serve(
        port: int = typer.Option(8000, help="TCP port to listen on."),
        host: str = typer.Option("127.0.0.1", help="Interface to bind."),
        model: str = typer.Option("sim-model@rev1", help="Served model id (= model revision)."),
        prefill_tokens_per_s: float = typer.Option(20_000.0, help="Prefill capacity."),
        cache_tokens: int = typer.Option(1_000_000, help="Prefix-cache capacity in tokens."),
        chunk_tokens: int = typer.Option(512, help="Chunked-prefill chunk size in tokens."),
        engine_id: str = typer.Option("sim-0", help="Engine id reported in results."),
        scheduling_policy: str = typer.Option(
            "priority", help="Priority (vLLM --scheduling-policy priority) or fcfs (ignores it)."
        ),
        prompt_tokens_details: bool = typer.Option(
            True, help="Report usage.prompt_tokens_details (vLLM --enable-prompt-tokens-details)."
        ),
        max_model_len: int = typer.Option(131_072, min=2, help="vLLM --max-model-len."),
        trust_request_chat_template: bool = typer.Option(
            True, help="Take a request's own chat_template (vLLM --trust-request-chat-template)."
        ),
        enable_auto_tool_choice: bool = typer.Option(
            True, help="Take tools under tool_choice auto (vLLM --enable-auto-tool-choice)."
        ),
        exclude_tools_when_tool_choice_none: bool = typer.Option(
            False, help="Drop tools under tool_choice none (the vLLM flag of that name)."
        ),
        log_stats: bool = typer.Option(
            True, help="Export vllm: series on /metrics (--no-log-stats: --disable-log-stats)."
        ),
    ) -> None:
        """Serve /v1/chat/completions, /v1/models, /metrics and /health."""
        import uvicorn

        from eventlog.clock import SystemClock
        from replay.engines.sim_core import SimEngineConfig
        from replay.engines.sim_server import create_app
        from replay.engines.simulated import SimulatedEngine

        config = SimEngineConfig(
            prefill_tokens_per_s=prefill_tokens_per_s,
            cache_tokens=cache_tokens,
            chunk_tokens=chunk_tokens,
            scheduling_policy="fcfs" if scheduling_policy == "fcfs" else "priority",
            prompt_tokens_details=prompt_tokens_details,
            max_model_len=max_model_len,
            trust_request_chat_template=trust_request_chat_template,
            enable_auto_tool_choice=enable_auto_tool_choice,
            exclude_tools_when_tool_choice_none=exclude_tools_when_tool_choice_none,
            log_stats=log_stats,
        )
        if scheduling_policy not in ("priority", "fcfs"):
            raise typer.BadParameter("priority or fcfs", param_hint="--scheduling-policy")
        engine = SimulatedEngine(engine_id, model, config, SystemClock())
        uvicorn.run(create_app(engine), host=host, port=port, log_level="warning")

    app.add_typer(group, name="sim-engine")
