"""Context-1's agentic search (docs/methods.md section 3): corpora, retrieval, synthetic tasks and evaluation."""
