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
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            return env.from_string(self.template)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"chat template does not parse: {e}") from None

    def render(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **extra,
    ) -> str:
        """The prompt text for ``messages`` (and ``tools``, if the template uses them)."""
        try:
            return self._compiled.render(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **{**self.variables, **extra},
            )
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template failed: {e}") from None

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
