"""Context-1's agentic search (methods.md section 3): corpora, retrieval, synthetic tasks and evaluation."""
