"""`ProfileError`: a profile, or an option that stands for a profile field, is not usable (exit code 2)."""


class ProfileError(ValueError):
    """A profile could not be read or is invalid. The message is one line naming cause and fix."""
