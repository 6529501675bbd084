"""Decoder building blocks as DSL kernels (issue 15): embedding, RMSNorm, rotary embedding, the LM head and greedy
sampling."""
