"""Single-turn code instruction datasets, as column mappings.

- OpenCodeInstruct: `id, input, output, domain, generation_algorithm, llm_judgement, unit_tests,
  tests_execution_status, average_test_score`
- Magicoder OSS-Instruct: `lang, raw_index, index, seed, openai_fingerprint, problem, solution`
- Magicoder Evol-Instruct: `instruction, response` (no id column: rows are hashed)
"""

from .columns import ColumnMapping

OPENCODEINSTRUCT = ColumnMapping(prompt="input", response="output", id="id")
MAGICODER_OSS = ColumnMapping(prompt="problem", response="solution", id="index")
MAGICODER_EVOL = ColumnMapping(prompt="instruction", response="response")
