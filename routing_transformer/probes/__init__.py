"""Long-range context probes of Sun et al. (EMNLP 2021) for any checkpoint the Scorer restores."""
