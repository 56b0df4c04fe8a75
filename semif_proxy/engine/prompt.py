"""The decision prompt (SemIf letter method): rendering and the token checks it relies on.

Pure functions: no HTTP, no engine. The model sees the evidence, the criterion and labelled
options; option ids never reach the prompt, so renaming an id cannot change an answer. Up to
26 options are lettered (A..Z: one token each, read from one position's logits); more, up to
255, are numbered (1..255: a few tokens each, scored as label sequences, see label_tree.py).
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
# The most options a decision (or a System One question) can have: Jev's own limit.
MAX_OPTIONS = 255
SYSTEM_TEXT = (
    "You are a careful decision function. Apply the criterion to the evidence and choose the "
    "one listed option that fits best. Answer with only the letter of that option, nothing else."
)


@dataclass(frozen=True)
class Labels:
    """How options are labelled in the prompt, and the prompt version that names it."""

    name: str
    prompt_version: str
    key: str  # the label's key in each listed option
    limit: int
    system_text: str

    def of(self, n: int) -> list[str]:
        if n > self.limit:
            raise ValueError(f"{self.name} label at most {self.limit} options, not {n}")
        return list(LETTERS[:n]) if self.name == "letters" else [str(i + 1) for i in range(n)]


LETTER_LABELS = Labels("letters", PROMPT_VERSION, "letter", len(LETTERS), SYSTEM_TEXT)
# Numbers: every model here splits them digit by digit (3 tokens at most for 255), and a
# numbered list is the form long catalogues take in text. "1" is a prefix of "12": the end of
# the answer is scored after such labels (label_tree.py).
NUMBER_LABELS = Labels(
    "numbers",
    "semif-number-v1",
    "number",
    MAX_OPTIONS,
    "You are a careful decision function. Apply the criterion to the evidence and choose the "
    "one listed option that fits best. Answer with only the number of that option, nothing else.",
)


def labels_for(n: int, scheme: str = "auto") -> Labels:
    """Letters up to 26 options (one token each, exact), numbers beyond (or always, when the
    operator asks for numbers)."""
    if scheme == "numbers" or n > LETTER_LABELS.limit:
        return NUMBER_LABELS
    return LETTER_LABELS


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


def user_payload(
    state: Any, question: str, descriptions: Sequence[str], labels: Labels = LETTER_LABELS
) -> dict[str, Any]:
    names = labels.of(len(descriptions))
    return {
        "evidence": state,
        "criterion": question,
        "options": [{labels.key: names[i], "description": d} for i, d in enumerate(descriptions)],
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

    def answer_end(self, messages: list[dict[str, str]], answer: str) -> str | None:
        """The text the template writes after an assistant answer (its end of turn), or None
        when the conversation with the answer does not extend the prompt."""
        prompt = self.render(messages)
        whole = self.render([*messages, {"role": "assistant", "content": answer}], False)
        if not whole.startswith(prompt + answer):
            return None
        return whole[len(prompt) + len(answer) :]

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        try:
            text = self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                enable_thinking=False,
                bos_token=self._bos,
                eos_token=self._eos,
            )
        except TemplateError as exc:
            raise TemplateRenderError(f"chat template failed: {exc}") from exc
        if self._strip_bos and text.startswith(self._bos):
            text = text[len(self._bos) :]
        return text


def decision_messages(
    state: Any, question: str, descriptions: Sequence[str], labels: Labels | None = None
) -> list[dict[str, str]]:
    labels = labels or labels_for(len(descriptions))
    return [
        {"role": "system", "content": labels.system_text},
        {"role": "user", "content": _dumps(user_payload(state, question, descriptions, labels))},
    ]


def render_decision(
    template: ChatTemplate,
    state: Any,
    question: str,
    descriptions: Sequence[str],
    labels: Labels | None = None,
) -> RenderedPrompt:
    messages = decision_messages(state, question, descriptions, labels)
    return render_messages(template, messages, state)


def render_messages(
    template: ChatTemplate, messages: list[dict[str, str]], state: Any
) -> RenderedPrompt:
    """A system and a user message whose JSON content starts with the evidence, rendered and
    split after the evidence (every readout's prompt has that shape)."""
    content = messages[1]["content"]
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


@dataclass(frozen=True)
class NumberCheck:
    tokens: tuple[tuple[int, ...], ...]  # label "1".."255"'s tokens after a prompt
    end: int  # the token that ends an answer (end of turn)
    reason: str | None  # why numbered labels cannot be scored with this model, or None


def check_numbers(
    tokenize_prompt: Callable[[str], list[int]],
    tokenize_text: Callable[[str], list[int]],
    sample_prompt: str,
    answer_end: str | None,
    eos: int,
) -> NumberCheck:
    """Each number label appended to a rendered prompt must append exactly its own tokens (no
    merge across the answer boundary), and the end of an answer must be one known token."""
    base = tokenize_prompt(sample_prompt)
    labels = NUMBER_LABELS.of(MAX_OPTIONS)
    tokens: list[tuple[int, ...]] = []
    problems: list[str] = []
    for label in labels:
        alone = tuple(tokenize_text(label))
        if tokenize_prompt(sample_prompt + label) != [*base, *alone]:
            problems.append(f"prompt + {label!r} does not tokenize as prompt tokens + {alone}")
        tokens.append(alone)
    end = eos
    if answer_end:
        after = tokenize_prompt(sample_prompt + "1" + answer_end)
        head = [*base, *tokens[0]]
        if after[: len(head)] == head and len(after) > len(head):
            end = after[len(head)]
    if end < 0:
        problems.append("the model has no end-of-turn token")
    reason = "; ".join(problems[:3]) or None
    return NumberCheck(tokens=tuple(tokens), end=end, reason=reason)
