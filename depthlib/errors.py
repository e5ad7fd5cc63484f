"""The one exception type for bad input.

Library functions raise :class:`InputError` with a one-line message naming what is wrong (the row and
column, the option and its allowed values, ...). The CLI turns it into ``depthlib: error: ...`` and exit
status 2; notebooks show the message. Never let bad input surface as a traceback from deep inside torch.
"""


class InputError(ValueError):
    """Bad input from a user: a missing column, an unknown model, an out-of-range option."""


class MachineError(RuntimeError):
    """The machine cannot do what was asked (no SLURM here, an executor's package missing): one line, exit status 1,
    raised before anything is computed or deleted."""


class ReplayUnavailable(MachineError):
    """A committed run's replay needs files a fresh clone does not have (e.g. chapter 3's converged student weights,
    which live only in the local cache): the replay test skips with this one-line reason."""
