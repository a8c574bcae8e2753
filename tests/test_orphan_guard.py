"""orphan_guard: a later call keeps the launcher the first call found (distributed/train.py calls
die_with_parent() first, then start_orphan_guard(), which calls it again)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# Runs in a child so that PR_SET_PDEATHSIG and the environment change stay out of the test process.
_SCRIPT = textwrap.dedent(
    """
    import os
    from lab_helpers.training import orphan_guard
    os.environ[orphan_guard.LAUNCHER_PID_ENV] = str(os.getppid())
    first = orphan_guard.die_with_parent()
    os.getppid = lambda: 1  # the launcher died between the two calls: the child now belongs to init
    second = orphan_guard.die_with_parent()
    print(first, second)
    """
)


def test_a_later_call_keeps_the_launcher_found_first() -> None:
    out = subprocess.run([sys.executable, "-c", _SCRIPT], check=True, capture_output=True, text=True).stdout
    first, second = out.split()
    assert first == str(os.getpid())  # this test process started the child: it is the launcher
    assert second == first  # not init (1): the guard would then watch init and never fire


def test_a_new_launcher_in_the_environment_replaces_the_one_inherited() -> None:
    """A run forked by the warm server inherits the server's module state; the variable its server sets wins."""
    script = textwrap.dedent(
        """
        import os
        from lab_helpers.training import orphan_guard
        orphan_guard._launcher_pid = 999999  # what a fork inherits from the server's own call
        os.environ[orphan_guard.LAUNCHER_PID_ENV] = str(os.getppid())
        print(orphan_guard.die_with_parent())
        """
    )
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    assert out.split() == [str(os.getpid())]
