"""The embedded demo: a tiny Kimi-K2.5-like target built from a synthetic corpus, its prompts."""
