"""Errors the command line turns into one line and exit code 2."""

class UserError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""
