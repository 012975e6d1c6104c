"""Stand-in for the SGLang package of the same name (tests only)."""
