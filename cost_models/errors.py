"""The project's one error type for problems a user can fix.

Its message names the field, the value, the rule and what would be accepted, e.g.
`tp(8)·pp(4)·cp(2) = 64 does not divide gpus(96)`. Only the CLI turns it into a red line and
exit code 2; library callers catch it like any ValueError.
"""


class SpecError(ValueError):
    """A user-fixable problem with a model, cluster, training spec or layout."""


class LayoutError(SpecError):
    """A layout a framework refuses, where another layout of the same model and training may be
    accepted (the search skips it and goes on); its message starts with "layout: "."""
