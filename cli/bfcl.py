"""``mlx_agent eval-bfcl``: BFCL's AST categories against the server's chat service."""

from __future__ import annotations

import contextlib

import click

from . import paths
from .errors import UserError
from .fanout import WorkerTally, check_ray_options, ray_options, runs_file
from .options import (BATCH, STATED_HELP, load_options, max_tokens_option, model_argument,
                      protocol_option)


def print_table(rows: list[dict]) -> None:
    click.echo(f"{'category':<24} {'mode':<9} {'accuracy':>9} {'n':>4} {'parse err':>10} "
               f"{'hops':>5} {'seconds':>8}")
    for r in rows:
        click.echo(f"{r['category']:<24} {r['tool_mode']:<9} {r['accuracy']:>9.1%} {r['n']:>4} "
                   f"{r['parse_errors']:>10} {r['mean_hops']:>5.2f} {r['seconds']:>8.1f}")
    if rows:
        mean = sum(r["accuracy"] for r in rows) / len(rows)
        click.echo(f"{'mean':<24} {'':<9} {mean:>9.1%}")


@click.command("eval-bfcl")
@model_argument()
@click.option("--categories", default="simple,multiple,parallel,parallel_multiple,irrelevance",
              show_default=True, help="Comma-separated BFCL categories.")
@click.option("--tool-mode", type=click.Choice(["full", "deferred"]), default="full",
              show_default=True)
@protocol_option
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Questions per category (default: all).")
@max_tokens_option()
@click.option("--no-stated-arguments", is_flag=True, help=STATED_HELP)
@click.option("--batch", type=BATCH, default=1, show_default=True,
              help="Questions answered at a time, decoded together in one batch.")
@click.option("--out", type=click.Path(dir_okay=False), required=True,
              help="JSONL file: one row per category (rewritten after each).")
@click.option("--runs", type=click.Path(dir_okay=False), default=None,
              help="JSONL file: one row per question (task, seed, reward, calls, turns, "
                   "answered, seconds).")
@load_options
@ray_options
def eval_bfcl(model_spec, categories, tool_mode, protocol, limit, max_tokens,
              no_stated_arguments, batch, out, runs, adapter, weights, context_length,
              ray_address, ray_workers):
    """Score the model on BFCL's AST categories, grammar on.

    \b
    Categories: simple, multiple, parallel, parallel_multiple, irrelevance, live_simple,
    live_multiple, live_parallel, live_parallel_multiple, live_irrelevance.
    Example:
      mlx_agent eval-bfcl --categories simple,parallel --limit 20 --out bfcl.jsonl
      mlx_agent eval-bfcl --batch 8 --limit 50 --out bfcl.jsonl
      mlx_agent eval-bfcl --limit 100 --out bfcl.jsonl --runs runs.jsonl --ray auto
    """
    from mlx_agent.bfcl import (CATEGORIES, BFCLMissing, as_row, bfcl, category_questions,
                                question_row)
    from mlx_agent.fileio import write_jsonl
    from mlx_agent.progress import Progress

    names = [c.strip() for c in categories.split(",") if c.strip()]
    if not names:
        raise click.BadParameter("give at least one category", param_hint="--categories")
    unknown = [c for c in names if c not in CATEGORIES]
    if unknown:
        raise click.BadParameter(f"unknown category {unknown[0]!r}; choose from "
                                 + ", ".join(CATEGORIES), param_hint="--categories")
    twice = next((c for i, c in enumerate(names) if c in names[:i]), None)
    if twice:  # it would run twice, and --runs would hold each of its questions twice
        raise click.BadParameter(f"{twice!r} is given twice; give each category once",
                                 param_hint="--categories")
    check_ray_options(ray_address, ray_workers)
    paths.writable_file(out, "--out")
    paths.writable_file(runs, "--runs", not_same_as={"--out": out})
    try:
        bfcl()  # before the model loads
    except BFCLMissing as e:
        raise UserError(str(e)) from None
    with contextlib.ExitStack() as stack:
        if ray_address:
            score_category = _on_ray(stack, model_spec, adapter, weights, context_length,
                                     tool_mode, protocol, max_tokens, batch, ray_address,
                                     ray_workers, not no_stated_arguments)
        else:
            score_category = _local(model_spec, adapter, weights, context_length,
                                    tool_mode, protocol, max_tokens, batch,
                                    not no_stated_arguments)
        rows = []
        order = {q["id"]: i for i, q in enumerate(  # BFCL's ids are unique across categories
            q for name in names for q in category_questions(name, limit))}
        run_rows = stack.enter_context(runs_file(runs, order))
        for name in names:
            with Progress(len(category_questions(name, limit)), name, unit="q") as bar:
                score = score_category(name, limit, bar,
                                       lambda item: run_rows.append(question_row(item)))
            rows.append(as_row(score))
            write_jsonl(out, rows)
            click.echo(f"{name}: {score.accuracy:.1%} of {score.n} ({score.seconds:.0f} s)",
                       err=True)
    print_table(rows)


def _local(model_spec, adapter, weights, context_length, tool_mode, protocol,
           max_tokens, batch, stated_arguments):
    """``score(category, limit, bar, record)`` in this process (``batch`` > 1: questions
    decoded together)."""
    from mlx_agent.batch_runner import batch_engines
    from mlx_agent.bfcl import run_category
    from mlx_agent.models import load
    from mlx_agent.serve import ChatService

    lm = load(model_spec, adapter=adapter, weights=weights, context_length=context_length)
    # one service; with a batch, its lanes take that many questions at once
    engines = batch_engines(lm, batch) if batch > 1 else []
    main = ChatService(lm, tool_mode=tool_mode, protocol=protocol, kv_slots=0, engines=engines,
                       stated_arguments=stated_arguments)
    cancel = engines[0].runner.cancel if engines else None  # Ctrl-C ends the batch's questions

    def score(name, limit, bar, record):
        def scored(item):
            record(item)
            bar.advance(f"{'✓' if item['ok'] else '✗'} {item['id']}")

        return run_category(main, name, limit=limit, max_tokens=max_tokens, at_once=batch,
                            on_item=scored, cancel=cancel)

    return score


def _on_ray(stack, model_spec, adapter, weights, context_length, tool_mode, protocol,
            max_tokens, batch, address, workers, stated_arguments):
    """``score(category, limit, bar, record)`` on a Ray pool, one for all categories; each
    worker answers ``batch`` questions at a time."""
    from mlx_agent.cluster_eval import BfclWorker, ModelSpec, bfcl_category
    from mlx_agent.fanout import Pool

    worker = BfclWorker(ModelSpec(model_spec, adapter, weights, context_length), tool_mode,
                        protocol, max_tokens, batch, stated_arguments)
    pool = stack.enter_context(Pool(worker, address=address, workers=workers, slots=batch))
    tally = WorkerTally()

    def score(name, limit, bar, record):
        return bfcl_category(pool, tool_mode, name, limit=limit, on_item=record,
                             on_answer=lambda qid, w: bar.advance(tally(f"{qid} answered", w)))

    return score
