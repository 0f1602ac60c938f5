"""Source for the child processes of the Ctrl-C race tests: ``CTRL_C_AT`` defines
``ctrl_c_at(at, names)``, which sends the process SIGINT (Python's default handler: a
KeyboardInterrupt) just after the ``at``-th return of a C function named one of ``names``
(any C function where None), once, by a profile hook, so that a race is hit at every point
of a call in turn. Prepended to each child's script; the parent runs ``python -c``."""

CTRL_C_AT = '''
import os, signal, sys
def ctrl_c_at(at, names=None):
    left = [at]
    def hook(frame, event, arg):
        if event == "c_return" and (names is None or getattr(arg, "__name__", "") in names):
            left[0] -= 1
            if left[0] == 0:
                sys.setprofile(None)
                os.kill(os.getpid(), signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.setprofile(hook)
'''
