"""Rank 0's progress display (examples/serve/progress.py): one line rewritten in place on a terminal, plain lines
at most every interval otherwise, the final state always shown, nothing on other ranks."""
import io

from examples.serve.progress import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def feed(progress):
    for step, elapsed in enumerate([0.0, 0.5, 1.0, 2.5, 2.6]):
        progress.update(step, step, 4, 10 * step, elapsed)
    progress.close()


def test_plain_lines_every_interval_and_the_last_state():
    out = io.StringIO()
    feed(Progress(True, interval_s=2.0, stream=out))
    lines = out.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["0", "3", "4"]      # steps 0, 3 (2.5 s) and the final one
    assert "requests done   4/4" in lines[-1] and "\r" not in out.getvalue()


def test_one_line_in_place_on_a_terminal():
    out = Terminal()
    feed(Progress(True, interval_s=2.0, stream=out))
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n") and text.count("\r") >= 3
    assert "requests done   4/4" in text.rsplit("\r", 1)[1]


def test_other_ranks_print_nothing():
    out = Terminal()
    feed(Progress(False, stream=out))
    assert out.getvalue() == ""
