"""Chat turns: the texts of a chat template's turns, each cut out of a
``tokenizer.apply_chat_template`` rendering, so that every turn can be tokenised on its own.

A turn's text is cut out of a rendering that follows a fixed reference exchange, so a turn is
rendered as it appears after other turns (no default system prompt inside it). A template that
renders a turn differently depending on the turns around it cannot be cut so, and is refused.
"""

from __future__ import annotations


class ChatTurns:
    """The chat half of :class:`~icl_ssm.lm.prompts.PromptBuilder`: renders turns with its
    ``tokenizer``'s chat template, their texts from its ``task``."""

    _REF_USER = "Reference question"
    _REF_ASSISTANT = "Reference answer"

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )

    def _system(self) -> list[dict[str, str]]:
        instruction = self.task.instruction.strip()
        return [{"role": "system", "content": instruction}] if instruction else []

    def _user(self, text: str) -> dict[str, str]:
        return {"role": "user", "content": f"{self.task.input_prefix}{text.strip()}".strip()}

    def _reference(self) -> list[dict[str, str]]:
        return [
            *self._system(),
            self._user(self._REF_USER),
            {"role": "assistant", "content": self._REF_ASSISTANT},
        ]

    def _cut_after_reference(self, messages: list[dict[str, str]], gen: bool, what: str) -> str:
        base = self._render(self._reference(), False)
        rendered = self._render([*self._reference(), *messages], gen)
        if not rendered.startswith(base):
            raise self._not_compositional(what)
        return rendered[len(base) :]

    def _render_demo_turns(self, text: str, answer: str) -> str:
        turns = [self._user(text), {"role": "assistant", "content": answer}]
        return self._cut_after_reference(turns, False, "a demonstration")

    def _render_query_turn(self, text: str) -> str:
        return self._cut_after_reference([self._user(text)], True, "the query")

    def _not_compositional(self, what: str) -> ValueError:
        return ValueError(
            f"the chat template of {type(self.tokenizer).__name__} renders {what} differently "
            "depending on the turns around it, so turns cannot be tokenised independently; "
            "use chat=False"
        )
