class UserError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""
