"""User-facing errors: one clear line, exit code 2, no traceback (see cli.main)."""


class UserError(Exception):
    """A mistake in the user's input (recipe, model name, data); printed as one line."""

    exit_code = 2
