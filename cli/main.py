"""The ``mlx_agent`` command line.

Every user error (a bad path, a corrupt file, a prompt that does not fit) ends with one line
on stderr and exit code 2, never a traceback. Commands import the runtime in their bodies,
and the shared options (:mod:`.options`) read their defaults from modules that import no
model code, so ``--help`` and usage errors answer without loading MLX, mlx-lm or
transformers (0.26 s against 2.6-2.8 s before, on the 2-core Linux machine).
"""

from __future__ import annotations

import sys

import click

from .agent import agent
from .bench import bench
from .bfcl import eval_bfcl
from .cache import cache
from .errors import Group, UserError, warn
from .options import (TEXT, cache_mode, cache_options, max_tokens_option, model_options,
                      sampling_options, utf8_text)
from .serve import serve
from .specialize import specialize
from .synth import synth
from .terminal import for_terminal
from .tools import tools
from .train import eval_cmd, sft, traces_to_data
from .traj import traj


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mlx-agent")
def main():
    """Run small language models as on-device agents with MLX.

    \b
    Examples:
      mlx_agent models
      mlx_agent generate --chat "What is the capital of France?"
      mlx_agent generate -m model.tinygpt --max-tokens 64 "Once upon a time"
    """


@main.command()
def models():
    """List the named models, where their files are, and the CPU fast path in use."""
    import mlx.core as mx

    from mlx_agent import blas
    from mlx_agent.models import (MODEL_ENV, NAMED_MODELS, ModelError, default_adapter,
                                  default_spec, resolve, weight_path)

    default = default_spec()
    for name, (_, _, install) in NAMED_MODELS.items():
        mark = "*" if name == default else " "
        try:
            where = str(resolve(name))
        except ModelError:
            where = f"not installed ({install})"
        adapter = default_adapter(name)
        with_adapter = f" + adapter {adapter.name}" if adapter else ""
        click.echo(f"{mark} {name:<18} {where}{with_adapter}")
    if default not in NAMED_MODELS:
        try:
            where = str(resolve(default))
        except ModelError as e:
            where = f"not found: {e}"
        click.echo(for_terminal(f"* {default:<18} (from ${MODEL_ENV}) {where}"))
    if any(default_adapter(name) for name in NAMED_MODELS):
        click.echo("adapter: a tool-calling adapter, loaded by the commands that call tools "
                   "(--no-adapter: without it); generate runs without it")
    device = "metal" if mx.metal.is_available() else "cpu"
    click.echo(f"device: {device}; BLAS: {blas.status().describe()}; "
               f"weights: {weight_path()}")


@main.command()
@click.argument("prompt", type=TEXT)
@model_options
@cache_options
@sampling_options
@click.option("--chat", is_flag=True, help="Wrap PROMPT in the model's chat template.")
@click.option("--system", type=TEXT, default=None, help="System message (with --chat).")
@max_tokens_option(help="Tokens to generate.")
@click.option("--json-schema", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Constrain the output to JSON matching this JSON Schema file.")
@click.option("--grammar", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Constrain the output to this Lark grammar (as llguidance accepts it).")
@click.option("-v", "--verbose", is_flag=True, help="Print model, BLAS and speed to stderr.")
def generate(prompt, model_spec, adapter, weights, context_length, no_kv_preallocate,
             kv_window, temperature, top_p, top_k, min_p, seed, chat, system, max_tokens,
             json_schema, grammar, verbose):
    """Stream a completion of PROMPT ('-' reads standard input) to standard output.

    \b
    Examples:
      mlx_agent generate --chat "What is the capital of France?"
      mlx_agent generate --chat -t 0.8 --seed 7 "Write a haiku about tea."
      echo "def fib(n):" | mlx_agent generate --max-tokens 48 -
    """
    from mlx_agent import blas
    from mlx_agent.engine import SamplingParams
    from mlx_agent.models import load
    from mlx_agent.text import TextStream

    source = "the prompt"
    if prompt == "-":
        prompt, source = sys.stdin.buffer.read().decode("utf-8", "surrogateescape"), "stdin"
    utf8_text(prompt, source)
    if system and not chat:
        raise click.BadParameter("--system needs --chat", param_hint="--system")
    if chat and not prompt.strip():  # as `agent --single ""`: an empty turn asks nothing
        raise UserError("the message is empty; give the question to ask")
    if json_schema and grammar:
        raise click.UsageError("give --json-schema or --grammar, not both")
    lm = load(model_spec, adapter=adapter, weights=weights, context_length=context_length)
    if chat:
        messages = ([{"role": "system", "content": system}] if system else [])
        messages.append({"role": "user", "content": prompt})
        text = lm.chat.render(messages, add_generation_prompt=True)
    else:
        text = prompt
    ids = lm.prompt_ids(text)
    if not ids:
        raise UserError("the prompt is empty; give some text to continue")
    engine = lm.engine(cache_mode=cache_mode(no_kv_preallocate, kv_window),
                       kv_window=kv_window or None)
    sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k,
                              min_p=min_p, seed=seed)
    p = engine.sync(ids)
    stream = TextStream(engine, lm.tokenizer, sampling.sampler(), max_tokens=max_tokens,
                        stop_ids=lm.end_ids, constraint=_file_constraint(lm, json_schema, grammar),
                        continuation=not chat)
    for _, segment in stream:
        click.echo(segment, nl=False)
        sys.stdout.flush()
    click.echo(stream.flush())
    finish = stream.finish_reason
    if finish == "length" and len(stream.ids) < max_tokens and engine.room == 0:
        finish = "context"  # the context ended it, not --max-tokens
        warn(f"the context is full ({engine.context_length} tokens): stopped after "
             f"{len(stream.ids)} of --max-tokens {max_tokens} (raise --context-length)")
    if verbose:
        ident = lm.identity
        click.echo(
            f"[{for_terminal(ident.name)} ({ident.format}, {ident.weight_format}), BLAS "
            f"{blas.status().name}] prompt {len(ids)} tokens: {p.prefilled} prefilled in "
            f"{p.seconds * 1000:.0f} ms ({p.prefilled / max(p.seconds, 1e-9):.1f} tok/s); "
            f"{len(stream.ids)} generated at {stream.decode_tps:.1f} tok/s; "
            f"finish: {finish}",
            err=True,
        )


def _file_constraint(lm, json_schema: str | None, grammar: str | None):
    """The constraint of ``--json-schema`` or ``--grammar`` (None without either)."""
    if not (json_schema or grammar):
        return None
    from mlx_agent.grammar import Constraint, grammar_from_file, ll_tokenizer

    tokenizer = ll_tokenizer(lm)
    compiled = grammar_from_file(json_schema or grammar,
                                 "json-schema" if json_schema else "lark", tokenizer)
    return Constraint(tokenizer, compiled, lm.vocab_size).admitting(
        json_schema or grammar, "JSON value" if json_schema else "text")


main.add_command(agent)
main.add_command(bench)
main.add_command(cache)
main.add_command(serve)
main.add_command(traj)
main.add_command(traces_to_data)
main.add_command(sft)
main.add_command(eval_cmd)
main.add_command(eval_bfcl)
main.add_command(synth)
main.add_command(specialize)
main.add_command(tools)

if __name__ == "__main__":
    main(prog_name="mlx_agent")  # as the installed command names itself
