"""Text in and out: reading raw files, subword vocabularies, special ids, casing, target-language tokens."""
