"""``mlx_agent serve``: the OpenAI- and Ollama-compatible server."""

from __future__ import annotations

import click

from . import paths
from .errors import UserError, warn
from .options import (ALLOW_REPEAT_HELP, BATCH, STATED_HELP, Bytes, Finite, load_options,
                      max_tokens_option, model_argument, prompt_cache_dtype_option, protocol_option,
                      sampling_options)


@click.command()
@model_argument()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="0 picks a free port (printed at start-up).")
@click.option("--tools", "tools_file", type=click.Path(dir_okay=False), default=None,
              help="Tools offered when a request sends none (the request's tools win).")
@click.option("--tool-mode", type=click.Choice(["full", "deferred"]), default="full",
              show_default=True,
              help="deferred: a one-line index plus get_tool_info, answered by the server.")
@click.option("--tool-metrics-out", type=click.Path(dir_okay=False), default=None,
              help="Append one JSON line per chat request (tool mode, hops, tokens).")
@protocol_option
@click.option("--prompt-cache-dir", type=click.Path(file_okay=False), default=None,
              help="Load the tools block's KV state from here at start-up (saved on a miss).")
@prompt_cache_dtype_option
@click.option("--kv-slots", type=click.IntRange(min=0), default=4, show_default=True,
              help="Earlier conversations whose KV state is kept for prefix reuse.")
@max_tokens_option(512, help="Reply length when a request sets none.")
@click.option("--allow-repeat-calls", is_flag=True, help=ALLOW_REPEAT_HELP)
@click.option("--no-stated-arguments", is_flag=True, help=STATED_HELP)
@click.option("--max-body-bytes", type=Bytes(min=1024), default=8 * 1024 * 1024,
              show_default=True, help="Larger request bodies get a 413.")
@click.option("--max-batch", type=BATCH, default=1, show_default=True,
              help="Requests decoded together in one batch (more wait their turn).")
@click.option("--request-timeout", type=Finite(min=0.1), default=30.0,
              show_default=True,
              help="Seconds a request's headers and body have to arrive (else a 408).")
@click.option("--max-connections", type=click.IntRange(min=1), default=None,
              help="Open connections at once; one more gets a 503.  [default: what the "
                   "file-descriptor limit allows, at most 4096]")
@load_options
@sampling_options
def serve(model_spec, host, port, tools_file, tool_mode, tool_metrics_out, protocol,
          prompt_cache_dir, prompt_cache_dtype, kv_slots, max_tokens, allow_repeat_calls,
          no_stated_arguments, max_body_bytes, max_batch, request_timeout, max_connections,
          adapter, weights, context_length, temperature, top_p, top_k, min_p, seed):
    """Serve the model over the OpenAI and Ollama HTTP APIs.

    \b
    Examples:
      mlx_agent serve --port 8080
      mlx_agent serve model.gguf --tools tools.json --tool-mode deferred
      mlx_agent serve --max-batch 8     # up to 8 requests decode together
      curl localhost:8080/v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}]}'

    Sampling options are the defaults for requests that set none.
    """
    from mlx_agent.engine import SamplingParams
    from mlx_agent.models import load
    from mlx_agent.serve import ChatService, http, make_app
    from mlx_agent.thread_state import executor
    from mlx_agent.tools import load_tools

    if tool_metrics_out:  # before the model loads, as the port
        paths.appendable_file(tool_metrics_out, "--tool-metrics-out",
                              not_same_as={"--tools": tools_file})
    sock = _listen(host, port)  # before the model loads: a taken port fails at once
    tools = load_tools(tools_file, runnable=False, handlers="list") if tools_file \
        else []  # clients run them
    for warning in (w for t in tools for w in t.warnings):
        click.secho(f"warning: {warning}", err=True, fg="yellow")
    # Everything that touches MLX runs on one thread (MLX's streams are per thread on
    # Metal): alone, the one that loads the model, which the server hands every request;
    # batched, the batch runner's model thread, which max_batch request threads feed.
    pool = executor(max_batch, "mlx-agent-model")

    def build():
        lm = load(model_spec, adapter=adapter, weights=weights, context_length=context_length)
        engines = []
        if max_batch > 1:
            from mlx_agent.batch_runner import batch_engines

            engines = batch_engines(lm, max_batch)
        service = ChatService(lm, tools=tools, tool_mode=tool_mode, protocol=protocol,
                              kv_slots=kv_slots, default_max_tokens=max_tokens,
                              metrics_out=tool_metrics_out,
                              allow_repeat_calls=allow_repeat_calls,
                              stated_arguments=not no_stated_arguments, engines=engines)
        hit = None
        if prompt_cache_dir and tools:
            from mlx_agent.prompt_cache import PromptCache

            hit = service.prime(PromptCache(prompt_cache_dir, warn=warn,
                                            storage=prompt_cache_dtype))
        return service, hit

    service, hit = pool.submit(build).result()
    if hit is not None:
        state = "loaded" if hit.hit else "prefilled and saved"
        click.echo(f"tools block: {hit.tokens} tokens {state} ({hit.seconds * 1000:.0f} ms)",
                   err=True)
    sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                              seed=seed)
    app = make_app(service, sampling, pool, max_body_bytes)
    bound = sock.getsockname()[1]
    batched = f", batches of up to {max_batch}" if max_batch > 1 else ""
    cap = http.connection_cap(max_connections)  # raises the descriptor limit for it
    where = f"[{host}]" if ":" in host else host  # an IPv6 address, as a URL writes it
    click.echo(f"serving {service.model_name} ({service.protocol} protocol, {len(tools)} tool"
               f"{'' if len(tools) == 1 else 's'}, "
               f"{tool_mode} tool mode{batched}, up to {cap} connections) on "
               f"http://{where}:{bound}", err=True)
    if max_connections and cap < max_connections:
        click.secho(f"warning: --max-connections {max_connections} is more than the descriptor "
                    f"limit allows; {cap} it is (raise `ulimit -n` for more)", err=True,
                    fg="yellow")
    http.serve(app, sock, request_timeout=request_timeout, max_connections=cap)


def _listen(host: str, port: int):
    """A listening socket, so a taken port is a one-line error and port 0 a known port."""
    import socket


    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}; "
                        "choose another --port or --host") from None
    return sock
