"""Orchestration: host programs that submit InCore kernels as tasks to the aicpu engine, and run the rest."""
