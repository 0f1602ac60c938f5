"""Chat formats: a model's Jinja chat template, rendered the way Hugging Face renders it.

One renderer for every model format (GGUF ``tokenizer.chat_template``, a Hugging Face
``tokenizer_config.json``, or ChatML for models that ship none, such as byte-level
``.tinygpt`` files). The environment matches ``transformers``' ``apply_chat_template``:
sandboxed, ``trim_blocks`` and ``lstrip_blocks``, ``loopcontrols``, a ``tojson`` filter
that keeps non-ASCII, ``raise_exception`` and ``strftime_now``.

Rendering gives text; tokenizing it is the caller's job (special tokens in the text are
matched by the tokenizer). Not promised: templates that need Python objects beyond dicts,
lists and strings.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import UserFacingError

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class TemplateError(UserFacingError, ValueError):
    """The chat template failed to render these messages."""


def _raise(message: str):
    raise TemplateError(message)


RANGE_BUDGET = 1_000_000  # numbers ``range`` may give out in one render, all loops together
MAX_REPEAT = 100_000  # the longest string or list a template may make by ``*``
_budget = threading.local()


def _range(*args: int) -> range:
    """``range`` with one budget for the whole render: the sandbox caps each range at
    100,000, and two nested loops of that made a model file's template run for hours."""
    r = range(*args)
    _budget.left = getattr(_budget, "left", RANGE_BUDGET) - len(r)
    if _budget.left < 0:
        raise TemplateError(f"the chat template loops over more than {RANGE_BUDGET:,} numbers")
    return r


class _Sandbox(ImmutableSandboxedEnvironment):
    """The sandbox, with ``*`` and ``**`` bounded (``"x" * 10**9`` took a gigabyte)."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator, left, right):
        if operator == "**" and isinstance(right, int) and abs(right) > 64:
            raise TemplateError("the chat template raises a number to too high a power")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and \
                        n > MAX_REPEAT:
                    raise TemplateError("the chat template repeats a string or list too "
                                        "often")
        return super().call_binop(context, operator, left, right)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


@dataclass(frozen=True)
class ChatFormat:
    template: str = CHATML
    bos_token: str = ""
    eos_token: str = ""
    variables: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def _compiled(self):
        env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["range"] = _range
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            return env.from_string(self.template)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"chat template does not parse: {e}") from None
        except RecursionError:
            raise TemplateError("chat template is nested too deeply to parse") from None

    def render(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **extra,
    ) -> str:
        """The prompt text for ``messages`` (and ``tools``, if the template uses them). A
        template that fails in any way (a model file's may divide by zero, or recurse) is a
        TemplateError."""
        _budget.left = RANGE_BUDGET
        try:
            return self._compiled.render(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **{**self.variables, **extra},
            )
        except TemplateError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template failed: {e}") from None
        except (ArithmeticError, RecursionError, TypeError, ValueError, LookupError,
                AttributeError, MemoryError) as e:
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from None

    @cached_property
    def renders_tools(self) -> bool:
        """Whether the template shows a ``tools`` list to the model (some show it only in a
        system message, so a conversation with one is tried too)."""
        probe = [{"type": "function", "function": {
            "name": "probe_tool_x7", "description": "", "parameters": {"type": "object"}}}]
        user = {"role": "user", "content": "hi"}
        for msgs in ([user], [{"role": "system", "content": "s"}, user]):
            try:
                if "probe_tool_x7" in self.render(msgs, tools=probe):
                    return True
            except TemplateError:
                pass
        return False
