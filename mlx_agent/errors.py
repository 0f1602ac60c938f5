"""The one base class of errors a user (or an HTTP client) can act on.

Raised for bad input: a model that cannot load, a schema that does not compile, a prompt
that does not fit, a message that cannot be rendered. The command line turns each into one
line on stderr and exit code 2; the server into a 400. Anything else is a bug of ours and
keeps its traceback.
"""

from __future__ import annotations


class UserFacingError(Exception):
    """Bad input; the message says what is wrong and what to do. ``param``: the request
    field at fault, where a server names it in its error body (OpenAI's ``param``)."""

    param: str | None = None

    def __init__(self, *args, param: str | None = None):
        super().__init__(*args)
        if param is not None:
            self.param = param
