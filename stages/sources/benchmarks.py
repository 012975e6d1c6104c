"""Benchmark question sets. A benchmark gives prompts, so only the question becomes a turn: the
reference answer is not the target's reply (GSM8K's `answer`, HumanEval's `canonical_solution`
are left out).

- GSM8K: `question, answer`
- HumanEval: `task_id, prompt, canonical_solution, test, entry_point` (the prompt is the code stub,
  sent as is)
- MT-bench: `question_id, category, turns` (two user turns). Each later question follows a reply
  the dataset does not have: the target writes it when every turn is rewritten (`turn_bounds`);
  the prompt for the last turn alone (`prompt_messages`) is the first question.
"""

from collections.abc import Mapping

from .columns import ColumnMapping
from .conversation import Conversation, Turns, id_text
from .rows import RowError, require

GSM8K = ColumnMapping(prompt="question")
HUMANEVAL = ColumnMapping(prompt="prompt", id="task_id")


def mt_bench(record: Mapping) -> Conversation:
    questions = require(record, "turns", list)
    if not questions or not all(isinstance(q, str) for q in questions):
        raise RowError("field 'turns' must be a list of question strings")
    turns = Turns()
    turns.user(questions[0])
    for question in questions[1:]:
        turns.unwritten_reply()
        turns.user(question)
    return Conversation(id_text(record, "question_id"), turns.build(), None)
