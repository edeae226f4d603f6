"""Benchmark-eval statistics and deployment-gate rules (pure: no Django, no I/O).

`stats` holds the estimators and paired tests (pass@k, Wilson and bootstrap intervals, exact McNemar and sign
tests, `compare_paired` with per-slice Holm-corrected regression flags); `gates` holds the validated gate-rule
schema and `evaluate_rules`, which turns eval evidence into an auditable pass / fail / pending decision.
"""
