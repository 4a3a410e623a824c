"""Talking to a language model: the provider interface and its registry (chat), the providers themselves (one module
each under providers/), building one from a `--model` spec (pool), the prompt templates and their rendering
(prompting, prompts/), and reading a reply back: the candidate file in it (extract) or its SEARCH/REPLACE edits (diffs).
Nothing here knows about the search or the archive; the search builds its requests from these pieces."""
