"""Replay: recording a run's torch calls and running them again without the runtime around them.

One job per module: `scalars` (numbers read from data that remember their code), `capture` (the torch function
mode that records), `guards` (what a replay checks before it touches data), `passes` (clean-ups over the recorded
calls, then Python source), `results` (an entry's or block's return value as a plan), `policy` (the trial
policy's knobs), `entry` (replaying entry calls), `kernel` (replaying a kernel's blocks), `traced_code` (the
code variant a recorded run executes). Replay imports ops (the op library talks to it only through
`ops.recording`); orchestration imports replay, never the reverse. Nothing is imported here: importing a module
of this package costs only that module.
"""
