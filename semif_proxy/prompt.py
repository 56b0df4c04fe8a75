"""The decision prompt (SemIf letter method): rendering and the token checks it relies on.

Pure functions: no HTTP, no engine. The model sees the evidence, the criterion and lettered
options; option ids never reach the prompt, so renaming an id cannot change an answer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

PROMPT_VERSION = "semif-letter-v1"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
# One letter per option: the most options a decision (or a System One question) can have.
MAX_OPTIONS = len(LETTERS)
SYSTEM_TEXT = (
    "You are a careful decision function. Apply the criterion to the evidence and choose the "
    "one listed option that fits best. Answer with only the letter of that option, nothing else."
)
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class TemplateRenderError(ValueError):
    pass


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    state_prefix: str  # text up to the end of the evidence: shared by every question on it


def user_payload(state: Any, question: str, descriptions: Sequence[str]) -> dict[str, Any]:
    return {
        "evidence": state,
        "criterion": question,
        "options": [{"letter": LETTERS[i], "description": d} for i, d in enumerate(descriptions)],
    }


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _raise(message: str) -> None:
    raise TemplateError(message)


class ChatTemplate:
    """A GGUF chat template (Jinja) rendered like Hugging Face's apply_chat_template."""

    def __init__(
        self, source: str | None, bos_token: str = "", eos_token: str = "", strip_bos: bool = False
    ) -> None:
        self.source = source or CHATML_TEMPLATE
        self.is_fallback = source is None
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = lambda v, indent=None: json.dumps(
            v, ensure_ascii=False, indent=indent
        )
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(self.source)
        except TemplateError as exc:
            raise TemplateRenderError(f"chat template does not compile: {exc}") from exc
        self._bos = bos_token
        self._eos = eos_token
        # llama.cpp adds BOS itself when the model asks for it; a template that also writes it
        # would give two.
        self._strip_bos = strip_bos and bool(bos_token)

    def render(self, messages: list[dict[str, str]]) -> str:
        try:
            text = self._template.render(
                messages=messages,
                add_generation_prompt=True,
                enable_thinking=False,
                bos_token=self._bos,
                eos_token=self._eos,
            )
        except TemplateError as exc:
            raise TemplateRenderError(f"chat template failed: {exc}") from exc
        if self._strip_bos and text.startswith(self._bos):
            text = text[len(self._bos) :]
        return text


def render_decision(
    template: ChatTemplate, state: Any, question: str, descriptions: Sequence[str]
) -> RenderedPrompt:
    content = _dumps(user_payload(state, question, descriptions))
    messages = [
        {"role": "system", "content": SYSTEM_TEXT},
        {"role": "user", "content": content},
    ]
    text = template.render(messages)
    # '{"evidence": <state>' is a text prefix of the user turn because the key comes first.
    state_part = _dumps({"evidence": state})[:-1]
    start = text.find(content)
    if start < 0:
        raise TemplateRenderError("chat template altered the user message; cannot split prompt")
    return RenderedPrompt(text=text, state_prefix=text[: start + len(state_part)])


def prompt_sha256(text: str) -> str:
    """The prompt's fingerprint in answers: sha256 of its UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class LetterCheck:
    ok: bool
    token_ids: tuple[int, ...]
    problems: tuple[str, ...]


def check_letters(
    tokenize_prompt: Callable[[str], list[int]],
    tokenize_text: Callable[[str], list[int]],
    piece: Callable[[int], str],
    sample_prompt: str,
) -> LetterCheck:
    """Every letter must be one token that decodes to itself, and appending it to a rendered
    prompt must append exactly that token (no merge across the answer boundary)."""
    ids: list[int] = []
    problems: list[str] = []
    base = tokenize_prompt(sample_prompt)
    for letter in LETTERS:
        alone = tokenize_text(letter)
        if len(alone) != 1:
            problems.append(f"{letter!r} tokenizes to {len(alone)} tokens {alone}")
            continue
        token = alone[0]
        if piece(token) != letter:
            problems.append(f"token {token} of {letter!r} decodes to {piece(token)!r}")
        joined = tokenize_prompt(sample_prompt + letter)
        if joined != [*base, token]:
            problems.append(f"prompt + {letter!r} does not tokenize as prompt tokens + [{token}]")
        ids.append(token)
    return LetterCheck(ok=not problems, token_ids=tuple(ids), problems=tuple(problems))
