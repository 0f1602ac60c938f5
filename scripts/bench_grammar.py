"""Grammar-constrained tool calls: validity and decode speed, with and without the grammar.

    .venv/bin/python scripts/bench_grammar.py [--model smollm2-135m] [--max-tokens 96]

On the task set ``tests/data/tool_tasks.jsonl`` (single-call prompts over the 6-tool
``tests/data/catalogue.json``), for each prompt the json protocol's reply is generated
greedily twice, once free and once under the grammar, from the same cached prompt. Prints the
share of replies that parse, name an existing tool, pass schema validation, and name the
expected tool with the expected arguments; and the decode time per token over all replies of
each run (the grammar's mask is computed on the CPU while the model computes the logits).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import mlx_agent  # noqa: F401  (fast BLAS before mlx)

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def main():
    from mlx_agent.formats import make_format
    from mlx_agent.grammar import Constraint, json_protocol_grammar, ll_tokenizer, string_budget
    from mlx_agent.models import load
    from mlx_agent.tools import load_tools

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--max-tokens", type=int, default=256, help="per reply (the agent's default)")
    args = ap.parse_args()

    lm = load(args.model)
    tools = load_tools(DATA / "catalogue.json")
    by_name = {t.name: t for t in tools}
    tasks = [json.loads(line) for line in (DATA / "tool_tasks.jsonl").read_text().splitlines()]
    tokenizer = ll_tokenizer(lm)
    grammar = json_protocol_grammar(tools, tokenizer, string_budget(args.max_tokens))
    constraint = Constraint(tokenizer, grammar, lm.vocab_size)
    engine = lm.engine(context_length=2048)

    results = {False: [], True: []}
    timing = {False: [0, 0.0], True: [0, 0.0]}
    fmt = make_format("json", lm)
    for task in tasks:
        prompt = fmt.prompt_ids([{"role": "user", "content": task["prompt"]}], tools)
        for grammar in (False, True):
            engine.sync(prompt)
            scanner = fmt.scanner()
            if grammar:
                constraint.reset()
            ids = []
            start = time.perf_counter()
            for token in engine.generate(max_tokens=args.max_tokens, stop_ids=lm.end_ids,
                                         constraint=constraint if grammar else None):
                ids.append(token)
                if token in lm.stop_ids or scanner.feed(lm.decode([token])):
                    break
            timing[grammar][0] += len(ids)
            timing[grammar][1] += time.perf_counter() - start
            scanner = fmt.scanner()
            scanner.feed(lm.decode(ids))
            reply = fmt.parse(scanner.turn_text)
            call = reply.calls[0] if reply.calls else None
            parsed = scanner.object_text is not None and (call is not None or reply.complete)
            tool = by_name.get(call.name) if call else None
            valid = tool is not None and not tool.validate(call.arguments)
            expected = bool(call and call.name == task["tool"] and call.arguments == task["arguments"])
            results[grammar].append(dict(
                parsed=parsed, call=call is not None, real=tool is not None, valid=valid,
                right_tool=bool(call and call.name == task["tool"]), right_call=expected))

    n = len(tasks)
    print(f"model: {lm.path.name}; {n} single-call tasks over {len(tools)} tools; greedy; "
          f"max {args.max_tokens} tokens a reply")
    print(f"{'':<11} {'parses':>7} {'are calls':>10} {'real tool':>10} {'valid args':>11}"
          f" {'right tool':>11} {'right call':>11} {'ms/token':>9}")
    for grammar in (False, True):
        rows = results[grammar]
        calls = [r for r in rows if r["call"]]

        def share(key, of):
            return f"{sum(r[key] for r in of)}/{len(of)}" if of else "-"

        toks, secs = timing[grammar]
        label = "grammar" if grammar else "no grammar"
        print(f"{label:<11} {share('parsed', rows):>7} {share('call', rows):>10}"
              f" {share('real', calls):>10} {share('valid', calls):>11}"
              f" {share('right_tool', rows):>11} {share('right_call', rows):>11}"
              f" {1000 * secs / max(toks, 1):>9.1f}")
    print("(real tool and valid args are counted over the replies that are tool calls)")
    slow = (timing[True][1] / timing[True][0]) / (timing[False][1] / timing[False][0])
    print(f"decode time per token with the grammar: {slow:.2f}x without")

    import mlx.core as mx

    from mlx_agent.kernels import apply_bitmask

    logits, mask = mx.random.normal((lm.vocab_size,)), constraint.mask()
    mx.eval(apply_bitmask(logits, mask))
    start = time.perf_counter()
    for _ in range(200):
        mx.eval(apply_bitmask(logits, mask))
    print(f"applying a mask to a {lm.vocab_size}-token row: "
          f"{(time.perf_counter() - start) / 200 * 1000:.3f} ms")


if __name__ == "__main__":
    main()
