"""The stages' reports (reports/*.json), one owner module each: the record a stage writes and the
report stage reads back. A key renamed on one side fails at the other, naming the file and the key,
instead of turning a figure into a quiet null.

Each module holds one report (check, prep, generate, merge, quality, vocab, extract, train,
benchmark, metrics), so that a stage's code deps take in its own report's module and no other:
editing one report's record reruns the stage that writes it and the report stage. `record` holds
what they share: the JSON encoding, the strict reading and its errors.
"""
