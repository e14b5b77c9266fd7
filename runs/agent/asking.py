"""The ``ask_user`` tool: the model asks a person and the run waits for the answer.

The tool itself only checks the question; the running step sees ``ASKED`` as the call's
output, checkpoints the conversation with that output standing in for the answer and
moves the run to ``awaiting_input`` (runs.steps.asking). The answer replaces the stand-in.
"""

from __future__ import annotations

from typing import Any

ASK_TOOL = "ask_user"
ASKED = "[waiting for a person's answer]"
MAX_QUESTION_CHARS = 4000
MAX_CHOICES = 10
MAX_CHOICE_CHARS = 200


def ask_check(question: Any, choices: Any = None) -> tuple[str, str, list[str]]:
    """(status, output, choices) of an ``ask_user`` call: ``ASKED`` when it may wait for a
    person, else an error for the model to fix."""
    text = str(question or "").strip()
    if not text:
        return "failed", "error: the question is empty; say what you need to know", []
    if len(text) > MAX_QUESTION_CHARS:
        return "failed", f"error: keep the question under {MAX_QUESTION_CHARS} characters", []
    offered = [str(c).strip() for c in (choices or []) if str(c).strip()]
    if len(offered) > MAX_CHOICES:
        return "failed", f"error: offer at most {MAX_CHOICES} choices", []
    if any(len(c) > MAX_CHOICE_CHARS for c in offered):
        return "failed", f"error: keep each choice under {MAX_CHOICE_CHARS} characters", []
    return "completed", ASKED, offered


def answer_text(answer: str, *, by: str) -> str:
    """The ask call's result once a person answered: what the model reads."""
    return f"Answer from {by or 'a person'}:\n{answer}"
