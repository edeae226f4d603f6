"""A search agent written as code, the teacher for the SFT warm-up when no larger model is at hand.

Context-1 warmed its policy up on trajectories of a large model (Kimi K2.5) running the same harness. A 135M model
on a CPU has no such teacher, and it does not call tools by itself, so RL from it sees reward 0 everywhere. This
agent plays the large model's part: it runs the real environment (the same tools, budget and output format) and
its trajectories go through the same rejection filter before the student is fine-tuned on them.

Its policy: search once for each quoted passage of the question (or the whole question when it quotes nothing),
then answer with the first passage of each search as `<Document>` items.

`workers.rl.teacher.teacher_rollout` turns its episodes into SFT samples.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from workers.envs.base import Message
from workers.envs.toolcalls import format_tool_call

SCRIPTED_TEACHER = "scripted-search"
_QUOTED = re.compile(r"[“\"]([^”\"]{12,})[”\"]")
_LABEL = re.compile(r"\[chunk (\S+) \|")
MAX_QUERY_WORDS = 32


class ScriptedSearchAgent:
    name = SCRIPTED_TEACHER

    def reply(self, messages: Sequence[Message]) -> str:
        question = next((m["content"] for m in messages if m["role"] == "user"), "")
        tool_messages = [m["content"] for m in messages if m["role"] == "tool"]
        if not tool_messages:
            quotes = _QUOTED.findall(question) or [question]
            calls = [
                format_tool_call("search_corpus", {"query": " ".join(q.split()[:MAX_QUERY_WORDS])}) for q in quotes[:3]
            ]
            return "\n".join(calls)
        picked: list[str] = []
        for content in tool_messages:
            labels = _LABEL.findall(content)
            if labels and labels[0] not in picked:
                picked.append(labels[0])
        items = "".join(
            f"<Document id={chunk_id}><Justification>matches a passage the question quotes</Justification></Document>"
            for chunk_id in picked
        )
        return items or "I found no passage."
