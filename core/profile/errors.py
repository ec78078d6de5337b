"""`ProfileError`: a profile, or an option that stands for a profile field, is not usable (exit code 2)."""


def one_line(text: str) -> str:
    """`text` with every character that is not printable (a line break, a control character) escaped, so a
    message that quotes the user's input stays one line however odd the input."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


class ProfileError(ValueError):
    """A profile could not be read or is invalid. The message is one line naming cause and fix (made one line
    here: a message quoting a YAML key or value with a line break in it would otherwise break in two)."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))
