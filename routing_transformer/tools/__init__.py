"""Command-line tools on trained models: `evaluate` (rt-evaluate), `score` (rt-score),
`checkpoints` (rt-convert), `analysis` (rt-analysis), `curves` (rt-curves) and the long-range
context `probes`. Import the T2T glue and the core.
"""
