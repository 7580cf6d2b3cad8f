"""Long-document tasks written without data (`--documents N`): the target first writes a document
of up to N tokens on a row's first user turn, in a genre from the list below; the conversation it
is trained on then opens with that document pasted into the user turn, followed by a task about it
(summarise, list its points, answer a question, rewrite a part). A user's long prompts are mostly
of this shape (a text, then what to do with it: Spec-Bench's summarisation and RAG rows), and their
replies copy from the context, which a draft head must learn to do at long positions.

Genre and task are picked per row from (seed, row index) alone, so a resumed run writes the same
conversations; the document is sampled with the data-free settings (temperature, top-p), each row
and seed its own stream, and greedy or sampled replies follow --temperature as usual."""

from __future__ import annotations

import random

GENRES = (
    "news article",
    "encyclopedia entry",
    "short story",
    "step-by-step technical tutorial",
    "product review",
    "formal letter",
    "set of lecture notes",
    "meeting transcript with several speakers",
    "opinion essay",
    "travel guide",
    "scientific abstract followed by a results section",
    "company policy document",
)

TASKS = (
    "Summarize the text above in a few sentences.",
    "List the main points of the text above as bullet points.",
    "Write a short title for the text above, then explain in two sentences why it fits.",
    "What are the three most important facts in the text above? Quote the sentences they come from.",
    "Rewrite the first paragraph of the text above so that a ten-year-old could understand it.",
    "Write five questions a reader could answer from the text above, each with its answer.",
    "Which names, places and numbers does the text above mention? List each with what the text says about it.",
    "Continue the text above with one more paragraph in the same style.",
)


def pick(seed: int, index: int) -> tuple[str, str]:
    """(genre, task) of row `index`: fixed by (seed, index), whatever else the run holds."""
    rng = random.Random(seed * 1_000_003 + index)
    return rng.choice(GENRES), rng.choice(TASKS)


def instruction(genre: str, topic: str, tokens: int) -> str:
    """What the target is asked, to write a row's document (~0.75 words a token)."""
    words = max(50, int(tokens * 0.7) // 50 * 50)
    return f"Write a {genre} of about {words} words on the following subject.\n\n{topic}"


def with_document(document: str, task: str) -> str:
    """The user turn the conversation trains on: the document, then the task about it."""
    return f"{document.strip()}\n\n{task}"
